"""What a new user meets first: the README's first screen (`pip install` with its extras, then
the two `make` commands), the extras it lists being pyproject's, the tour and `posenc explore`
named, and Triton pulled only by the `kernels` extra (and `dev`), only on Linux."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from posenc.lab.grid_file import tomllib  # tomllib, or on Python 3.10 its backport tomli

ROOT = Path(__file__).resolve().parent.parent
READMES = {"en": ROOT / "README.md", "zh": ROOT / "README.zh-CN.md"}
FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _first_screen(lang: str) -> str:
    """The README up to its first section heading."""
    return READMES[lang].read_text(encoding="utf-8").split("\n## ", 1)[0]


def _requirements(extra: str, seen: frozenset[str] = frozenset()) -> list[str]:
    """The requirements of an extra, its ``posenc[...]`` references expanded."""
    out = []
    for req in _project()["optional-dependencies"][extra]:
        own = re.fullmatch(r"posenc\[([\w,-]+)\]", req)
        if own is None:
            out.append(req)
            continue
        for name in own[1].split(","):
            if name not in seen:
                out += _requirements(name, seen | {extra})
    return out


@pytest.mark.parametrize("lang", READMES)
def test_first_screen_is_pip_install_then_the_two_make_commands(lang: str) -> None:
    blocks = [(m[1], m[2]) for m in FENCE.finditer(_first_screen(lang))]
    assert len(blocks) >= 2 and all(language == "bash" for language, _ in blocks[:2]), blocks
    pip, make = blocks[0][1], blocks[1][1]
    extras = _project()["optional-dependencies"]
    named = re.findall(r'pip install (?:-e )?"(?:posenc|\.)\[([\w,]+)\]"', pip)
    assert len(named) == 2, pip  # from the index, and from source in a clone
    assert all(e in extras for group in named for e in group.split(",")), named
    assert [line.split()[:2] for line in make.splitlines()] == [["make", "lab"], ["make", "test"]]
    assert _first_screen(lang).index("pip install") < _first_screen(lang).index("make lab")


def test_readme_names_every_extra_and_the_core_dependencies() -> None:
    screen = " ".join(_first_screen("en").split())
    listed = re.search(r"Extras: (.*?)\. The core needs only (.*?)\.", screen)
    assert listed, "the first screen lists the extras and the core dependencies"
    extras = set(re.findall(r"`([\w-]+)`", re.sub(r"\([^)]*\)", "", listed[1])))
    assert extras == set(_project()["optional-dependencies"])
    core = {re.split(r"[<>=!~; \[]", r, maxsplit=1)[0] for r in _project()["dependencies"]}
    assert set(re.split(r", | and ", re.sub(r" \([^)]*\)", "", listed[2]))) == core


def test_make_targets_the_readme_names_exist() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    for lang, path in READMES.items():
        named = set(re.findall(r"`make ([\w-]+)", path.read_text(encoding="utf-8")))
        assert {"lab", "test", "test-floors", "sdist-check"} <= named, lang
        assert named <= targets, (lang, named - targets)
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")  # CI runs the README's
    assert "bash .ci/sdist_check.sh" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


@pytest.mark.parametrize("lang", READMES)
def test_readme_points_to_the_tour_and_the_explorer(lang: str) -> None:
    text = READMES[lang].read_text(encoding="utf-8")
    tour = "docs/tour/index.md" if lang == "en" else "docs/tour/zh/index.md"
    assert f"]({tour})" in text and (ROOT / tour).is_file()
    assert "posenc explore --out" in text and "](docs/explore.md)" in text


def test_triton_only_through_the_kernels_extra_and_only_on_linux() -> None:
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    extras = _project()["optional-dependencies"]
    assert not [r for r in _project()["dependencies"] if r.startswith("triton")]
    for extra in extras:
        triton = [Requirement(r) for r in _requirements(extra) if r.startswith("triton")]
        if extra not in ("kernels", "dev"):  # dev: the suite runs Triton under TRITON_INTERPRET
            assert not triton, extra
            continue
        assert len(triton) == 1 and triton[0].marker is not None, (extra, triton)
        for platform, wanted in (("linux", True), ("win32", False), ("darwin", False)):
            env = {**default_environment(), "sys_platform": platform}
            assert triton[0].marker.evaluate(env) is wanted, (extra, platform)
