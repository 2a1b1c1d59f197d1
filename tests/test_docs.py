"""The documentation: every ```python block of docs/*.md, README.md and README.zh-CN.md runs
(the blocks of one file in order, in one namespace, after its ```python title="name.py" blocks
are written as files beside it and importable), the ```bash commands of the pages in
:data:`COMMAND_PAGES` run, and `mkdocs build --strict` passes."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from _docs_site import build_site

ROOT = Path(__file__).resolve().parent.parent
TOUR_FILES = sorted((ROOT / "docs" / "tour").rglob("*.md"))  # the tour, English and zh/
DOC_FILES = [
    *sorted((ROOT / "docs").glob("*.md")),
    *TOUR_FILES,
    ROOT / "README.md",
    ROOT / "README.zh-CN.md",
]
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
#: A file the page shows whole: ```python title="mymod.py"``` (written out, not executed).
FILE_FENCE = re.compile(
    r'^```python[ \t]+title="([\w.-]+\.py)"[ \t]*\n(.*?)^```[ \t]*$', re.MULTILINE | re.DOTALL
)
BASH_FENCE = re.compile(r"^```bash[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
#: Pages whose ```bash blocks are run too: each line is a ``posenc`` command.
COMMAND_PAGES = ("add-encoding.md",)


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """``(first line number, code)`` of each ```python block of a Markdown file."""
    text = path.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in FENCE.finditer(text)]


def page_files(path: Path) -> dict[str, str]:
    """``{file name: text}`` of each ```python title="name.py" block of a Markdown file."""
    return dict(FILE_FENCE.findall(path.read_text(encoding="utf-8")))


def write_page_files(path: Path, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's files written to ``folder``, importable from it (sys.path) for this test."""
    for name, text in page_files(path).items():
        (folder / name).write_text(text, encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))


@pytest.fixture
def isolated_registry(tmp_path: Path):
    """The modules a page's code imports from its folder (``tmp_path``), and the encodings
    they register, are gone after the test (anything else it imports stays)."""
    from posenc import registry

    before = set(registry.names())
    yield
    ours = {
        name
        for name, module in list(sys.modules.items())
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path))
    }
    for name in set(registry.names()) - before:
        if registry.entry(name).builder.__module__ in ours:
            registry.unregister(name)
    for name in ours:
        del sys.modules[name]


def english_page(path: Path) -> Path | None:
    """The English page a translation renders (``docs/tour/zh/x.md`` -> ``docs/tour/x.md``,
    ``README.zh-CN.md`` -> ``README.md``), or None for an English page."""
    if path.name == "README.zh-CN.md":
        return ROOT / "README.md"
    if path.parent.name == "zh" and path.parent.parent.name == "tour":
        return path.parent.parent / path.name
    return None


def _code_of(path: Path) -> tuple[list[str], dict[str, str]]:
    """A page's python blocks (without their line numbers) and the files it writes."""
    return [code for _, code in python_blocks(path)], page_files(path)


def test_block_extraction() -> None:
    md = "text\n```python\na = 1\n```\n```bash\nls\n```\n```python\nb = a + 1\n```\n"
    tmp = ROOT / "tests" / "__doc_sample__.md"
    try:
        tmp.write_text(md)
        assert python_blocks(tmp) == [(3, "a = 1\n"), (9, "b = a + 1\n")]
    finally:
        tmp.unlink()


@pytest.mark.parametrize(
    "path",
    [p for p in DOC_FILES if p.exists()],
    ids=lambda p: p.relative_to(ROOT / "docs").as_posix() if p in TOUR_FILES else p.name,
)
def test_doc_examples_run(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_registry: None
) -> None:
    blocks = python_blocks(path)
    if not blocks:
        pytest.skip(f"{path.name} has no python blocks")
    english = english_page(path)
    if english is not None and _code_of(english) == _code_of(path):
        # A translation whose code (and the files it writes) is the English page's, line for
        # line: that page's own case runs it; running it twice would test nothing more.
        return
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    write_page_files(path, tmp_path, monkeypatch)
    torch.manual_seed(0)
    namespace: dict[str, object] = {"__name__": f"doc_{path.stem}"}
    for line, code in blocks:
        try:
            exec(compile(textwrap.dedent(code), f"{path.name}:{line}", "exec"), namespace)
        except Exception as e:
            raise AssertionError(
                f"the example at {path.relative_to(ROOT)} line {line} failed: {e!r}"
            ) from e


def bash_commands(path: Path) -> list[list[str]]:
    """The commands of the ```bash blocks of a Markdown file, split as a shell would."""
    text = path.read_text(encoding="utf-8")
    return [shlex.split(line) for block in BASH_FENCE.findall(text) for line in block.splitlines()
            if line.strip()]  # fmt: skip


@pytest.mark.parametrize("name", COMMAND_PAGES)
def test_doc_commands_run(name: str, tmp_path: Path) -> None:
    """Each ``posenc`` command of the page runs (the ``posenc`` script where it is installed,
    a fresh process in a folder holding the page's files) and exits 0."""
    path = ROOT / "docs" / name
    for file, text in page_files(path).items():
        (tmp_path / file).write_text(text, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "200", "NO_COLOR": "1"}
    script = Path(sys.executable).with_name("posenc")  # not python -m: no folder on sys.path
    posenc = [str(script)] if script.exists() else [sys.executable, "-m", "posenc"]
    commands = bash_commands(path)
    assert commands, f"{name} has no bash commands"
    for argv in commands:
        assert argv[0] == "posenc", f"{name}: {shlex.join(argv)} is not a posenc command"
        res = subprocess.run([*posenc, *argv[1:]], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
        assert res.returncode == 0, f"{name}: {shlex.join(argv)}\n{res.stdout}\n{res.stderr}"
        assert "Traceback" not in res.stderr, res.stderr


def test_docstring_examples_run() -> None:
    """The ``>>>`` examples of the docstrings (shown in the API reference) run as doctests."""
    import doctest
    import importlib
    import pkgutil

    import posenc

    attempted, failures = 0, []
    for info in pkgutil.walk_packages(posenc.__path__, "posenc."):
        if info.name.endswith("__main__"):  # running it would start the CLI
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional dependency (e.g. triton) is absent
            continue
        flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
        result = doctest.testmod(module, optionflags=flags, verbose=False, report=False)
        attempted += result.attempted
        if result.failed:
            failures.append(f"{info.name}: {result.failed} of {result.attempted} failed")
    assert not failures, failures
    assert attempted > 0


def test_every_guide_has_code_and_a_figure() -> None:
    for name in ("absolute", "rotary", "bias", "relative", "lab"):
        text = (ROOT / "docs" / f"{name}.md").read_text(encoding="utf-8")
        assert python_blocks(ROOT / "docs" / f"{name}.md"), f"{name}.md has no python example"
        assert re.search(r"!\[[^\]]*\]\(img/[\w-]+\.png\)", text), f"{name}.md has no figure"
        for heading in ("## What it is", "## When to use it", "## The posenc call"):
            assert heading in text, f"{name}.md lacks {heading!r}"


def test_docs_build_strict(tmp_path_factory: pytest.TempPathFactory) -> None:
    # One build per session, shared with tests/test_docs_offline.py (tests/_docs_site.py).
    site, returncode, log = build_site(tmp_path_factory)
    assert returncode == 0, log[-4000:]
    assert "WARNING" not in log, log[-4000:]
    for page in ("index.html", "absolute.html", "api/functional.html"):
        assert (site / page).exists(), page
    kernels = (site / "api" / "kernels.html").read_text(encoding="utf-8")
    assert 'id="posenc.kernels.rope_qk"' in kernels and (site / "kernels.html").exists()
    assert 'id="posenc.relative.cope.CoPE"' in (site / "api/relative.html").read_text()
    # README.zh-CN.md as a page (docs/hooks.py), linked from the home page and the nav.
    zh = (site / "zh.html").read_text(encoding="utf-8")
    assert "在你自己的模型中使用位置编码" in zh and '<a href="index.html">English</a>' in zh
    home = (site / "index.html").read_text(encoding="utf-8")
    assert 'href="zh.html"' in home
    # What the READMEs link for the rest: the install page and the results pages the generated
    # tables are written into, in the navigation of every page.
    for page in ("install.html", "lab-results.html", "real-model.html"):
        assert (site / page).exists() and f'href="{page}"' in home, page
    results = (site / "lab-results.html").read_text(encoding="utf-8")
    assert "<!-- lab:table -->" in results and 'src="results/length.png"' in results
    assert 'src="results/real_smollm2.png"' in (site / "real-model.html").read_text("utf-8")
    assert (site / "img" / "wavelengths.png").stat().st_size > 5_000
    api = (site / "api" / "functional.html").read_text(encoding="utf-8")
    assert "rope_inv_freq" in api and "sinusoidal_table" in api  # generated from docstrings
    # Formulas are math (arithmatex marks them for MathJax), not code blocks.
    for page in ("absolute", "rotary", "bias", "relative", "lab"):
        built = (site / f"{page}.html").read_text(encoding="utf-8")
        assert 'class="arithmatex">\\[' in built, page  # a displayed formula
    assert "\\theta_i = \\text{base}^{-2i/d}" in (site / "rotary.html").read_text()


def test_formulas_are_math_not_code_blocks() -> None:
    """The guides write formulas as $...$ / $$...$$ (rendered by MathJax through
    pymdownx.arithmatex), never as ```text blocks; the Markdown extension is in the docs extra,
    and MathJax is shipped with the site (copied by docs/hooks.py), not loaded from a CDN."""
    yaml = pytest.importorskip("yaml")  # mkdocs's own dependency
    for path in sorted((ROOT / "docs").glob("*.md")):
        text = path.read_text(encoding="utf-8")
        assert "```text" not in text, path.name
    for name in ("absolute", "rotary", "bias", "relative", "lab"):
        assert "$$" in (ROOT / "docs" / f"{name}.md").read_text(encoding="utf-8"), name
    cfg = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    exts = [e if isinstance(e, str) else next(iter(e)) for e in cfg["markdown_extensions"]]
    assert "pymdownx.arithmatex" in exts
    scripts = cfg["extra_javascript"]
    assert "javascripts/mathjax.js" in scripts and (ROOT / "docs/javascripts/mathjax.js").exists()
    assert "javascripts/mathjax/tex-svg.js" in scripts
    assert not any(s.startswith(("http:", "https:", "//")) for s in scripts), scripts
    docs_extra = re.search(
        r"^docs = \[(.*?)\]$", (ROOT / "pyproject.toml").read_text(), re.M | re.S
    )
    assert docs_extra and '"pymdown-extensions' in docs_extra[1]
