"""The guided tour (docs/tour, English, and docs/tour/zh, Chinese): the Chinese pages run the
English pages' code, character for character; the results table the last step cites is the
lab results page's; every step draws the figure it shows. (tests/test_docs.py runs every cell.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOUR = ROOT / "docs" / "tour"
FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
GENERATED_BLOCK = re.compile(r"^<!-- (lab:[\w-]+) -->\n(.*?)^<!-- /\1 -->$", re.M | re.S)
EN_PAGES = sorted(TOUR.glob("*.md"))
STEPS = [p for p in EN_PAGES if re.match(r"\d\d-", p.name)]


def fenced(path: Path) -> list[tuple[str, str]]:
    return [(m[1], m[2]) for m in FENCE.finditer(path.read_text(encoding="utf-8"))]


def test_tour_has_its_steps_in_both_languages() -> None:
    assert [p.name[:2] for p in STEPS] == [f"{i:02}" for i in range(1, 9)]
    assert sorted(p.name for p in (TOUR / "zh").glob("*.md")) == [p.name for p in EN_PAGES]


@pytest.mark.parametrize("page", EN_PAGES, ids=lambda p: p.name)
def test_chinese_page_runs_the_english_code(page: Path) -> None:
    english, chinese = fenced(page), fenced(TOUR / "zh" / page.name)
    assert chinese == english, f"docs/tour/zh/{page.name}'s code differs from the English page's"


@pytest.mark.parametrize("page", STEPS, ids=lambda p: p.name)
def test_every_step_draws_its_figure(page: Path) -> None:
    """A learner running the cells gets each figure the page talks about: a .png written to the
    current folder by the page's last python cell."""
    code = [c for lang, c in fenced(page) if lang == "python"]
    assert len(code) >= 2, page.name
    assert re.search(r"(savefig|save_figure)\(.*\"[\w-]+\.png\"", code[-1]), page.name


def test_cited_results_are_the_lab_results_pages() -> None:
    """The last step cites the lab's results table; both pages carry it unchanged (the results
    page's block is written by `posenc lab report --readme docs/lab-results.md`)."""
    results = (ROOT / "docs" / "lab-results.md").read_text(encoding="utf-8")
    table = dict(GENERATED_BLOCK.findall(results))["lab:table"]
    for page in (TOUR / "08-extrapolation.md", TOUR / "zh" / "08-extrapolation.md"):
        blocks = dict(GENERATED_BLOCK.findall(page.read_text(encoding="utf-8")))
        assert blocks == {"lab:table": table}, page
