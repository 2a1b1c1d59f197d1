"""The documentation: every ```python block of docs/*.md, README.md and README.zh-CN.md runs
(the blocks of one file in order, in one namespace), and `mkdocs build --strict` passes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
DOC_FILES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / "README.zh-CN.md"]
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """``(first line number, code)`` of each ```python block of a Markdown file."""
    text = path.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in FENCE.finditer(text)]


def test_block_extraction() -> None:
    md = "text\n```python\na = 1\n```\n```bash\nls\n```\n```python\nb = a + 1\n```\n"
    tmp = ROOT / "tests" / "__doc_sample__.md"
    try:
        tmp.write_text(md)
        assert python_blocks(tmp) == [(3, "a = 1\n"), (9, "b = a + 1\n")]
    finally:
        tmp.unlink()


@pytest.mark.parametrize("path", [p for p in DOC_FILES if p.exists()], ids=lambda p: p.name)
def test_doc_examples_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = python_blocks(path)
    if not blocks:
        pytest.skip(f"{path.name} has no python blocks")
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    torch.manual_seed(0)
    namespace: dict[str, object] = {"__name__": f"doc_{path.stem}"}
    for line, code in blocks:
        try:
            exec(compile(textwrap.dedent(code), f"{path.name}:{line}", "exec"), namespace)
        except Exception as e:
            raise AssertionError(
                f"the example at {path.relative_to(ROOT)} line {line} failed: {e!r}"
            ) from e


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


def test_docs_build_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    pytest.importorskip("matplotlib")
    # Quick tiny models for the attention figures (docs/hooks.py); the figures are tested in
    # test_plots.py, this test checks the site builds without a warning.
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "POSENC_DOCS_TRAIN_STEPS": "3"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    assert "WARNING" not in log, log[-4000:]
    site = tmp_path / "site"
    for page in ("index.html", "absolute/index.html", "api/functional/index.html"):
        assert (site / page).exists(), page
    assert (site / "img" / "wavelengths.png").stat().st_size > 5_000
    api = (site / "api" / "functional" / "index.html").read_text(encoding="utf-8")
    assert "rope_inv_freq" in api and "sinusoidal_table" in api  # generated from docstrings
    # Formulas are math (arithmatex marks them for MathJax), not code blocks.
    for page in ("absolute", "rotary", "bias", "relative", "lab"):
        built = (site / page / "index.html").read_text(encoding="utf-8")
        assert 'class="arithmatex">\\[' in built, page  # a displayed formula
    assert "\\theta_i = \\text{base}^{-2i/d}" in (site / "rotary" / "index.html").read_text()


def test_formulas_are_math_not_code_blocks() -> None:
    """The guides write formulas as $...$ / $$...$$ (rendered by MathJax through
    pymdownx.arithmatex), never as ```text blocks; the build needs only the Markdown extension
    (in the docs extra), and MathJax itself is a script the served pages load from a CDN."""
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
    assert any(s.startswith("https://cdn.jsdelivr.net/npm/mathjax@3/") for s in scripts)
    docs_extra = re.search(r"^docs = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert docs_extra and '"pymdown-extensions' in docs_extra[1]
