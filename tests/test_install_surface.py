"""What a new user meets first: the README's first screen (that posenc is on no package index
yet, the two `make` commands, then the install from a clone), no install command anywhere that
fails on a fresh machine, the extras the install page lists being pyproject's, the tour and
`posenc explore` named, and Triton pulled only by the `kernels` extra (and `dev`), only on
Linux."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from posenc.lab.grid.grid_file import tomllib  # tomllib, or on Python 3.10 its backport tomli

ROOT = Path(__file__).resolve().parent.parent
READMES = {"en": ROOT / "README.md", "zh": ROOT / "README.zh-CN.md"}
INSTALL = ROOT / "docs" / "install.md"
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
def test_first_screen_is_the_two_make_commands_then_the_install_from_a_clone(lang: str) -> None:
    screen = _first_screen(lang)
    no_index = {
        "en": "posenc is not on a package index yet",
        "zh": "posenc 目前还没有发布到任何包索引上",
    }
    assert no_index[lang] in " ".join(screen.split()), "the first screen says where posenc is not"
    blocks = [(m[1], m[2]) for m in FENCE.finditer(screen)]
    assert len(blocks) == 2 and all(language == "bash" for language, _ in blocks), blocks
    make, pip = blocks[0][1], blocks[1][1]
    assert [line.split()[:2] for line in make.splitlines()] == [["make", "lab"], ["make", "test"]]
    named = re.findall(r'pip install -e "\.\[([\w,]+)\]"', pip)
    assert len(named) == 1, pip  # from source, in the clone
    assert all(e in _project()["optional-dependencies"] for e in named[0].split(",")), named


def _bash_lines() -> list[tuple[str, str]]:
    """``(file, line)`` of every line of a ```bash block of the READMEs and the docs pages."""
    pages = [*READMES.values(), *sorted((ROOT / "docs").rglob("*.md"))]
    return [(path.relative_to(ROOT).as_posix(), line) for path in pages
            for m in FENCE.finditer(path.read_text(encoding="utf-8")) if m[1] == "bash"
            for line in m[2].splitlines()]  # fmt: skip


def test_no_install_command_asks_an_index_for_posenc() -> None:
    """posenc is on no package index yet: every `pip install` the READMEs and the docs show
    installs it from a clone (`-e .` with extras), or installs something else (torch, a model
    file); none asks an index for posenc, which fails on a fresh machine."""
    pips = [(f, line) for f, line in _bash_lines() if "pip install" in line]
    assert len(pips) >= 4, pips  # README, docs/install.md, docs/index.md, docs/extend.md, ...
    for file, line in pips:
        args = line.split("#", 1)[0].split()
        assert not [a for a in args if re.match(r"""['"]?posenc\b""", a)], (file, line)


def test_install_page_names_every_extra_and_the_core_dependencies() -> None:
    screen = " ".join(INSTALL.read_text(encoding="utf-8").split())
    listed = re.search(r"Extras: (.*?)\. The core needs only (.*?)\.", screen)
    assert listed, "docs/install.md lists the extras and the core dependencies"
    extras = set(re.findall(r"`([\w-]+)`", re.sub(r"\([^)]*\)", "", listed[1])))
    assert extras == set(_project()["optional-dependencies"])
    core = {re.split(r"[<>=!~; \[]", r, maxsplit=1)[0] for r in _project()["dependencies"]}
    assert set(re.split(r", | and ", re.sub(r" \([^)]*\)", "", listed[2]))) == core


def test_make_targets_the_readme_names_exist() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    for path, wanted in (
        (READMES["en"], {"lab", "test", "docs"}),
        (READMES["zh"], {"lab", "test", "docs"}),
        (
            INSTALL,
            {"lab", "test", "demo", "docs", "bench", "test-floors", "sdist-check", "test-long"},
        ),
    ):
        text = path.read_text(encoding="utf-8")
        named = set(re.findall(r"`make ([\w-]+)", text)) | set(
            re.findall(r"^make ([\w-]+)", text, re.M)
        )
        assert wanted <= named, (path.name, wanted - named)
        assert named <= targets, (path.name, named - targets)
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
