"""MkDocs hook: what the site is built from besides docs/*.md, all of it made at build time.

Nothing generated is committed, and the built site needs no network:

* Figures: each build adds ``img/<name>.png`` from :func:`posenc.plots.make_figure`, so the
  pictures always show the code being documented. The guides link them as ``img/<name>.png``;
  MkDocs checks those links.
* Math: MathJax 3 (its ``es5`` build, from the installed ``django-static-mathjax`` package of the
  ``docs`` extra; nothing Django in it) is copied to ``javascripts/mathjax/``. The pages load it
  from there, with SVG output, which needs no font files.
* Code highlighting: Pygments colours the code blocks at build time (pymdownx.highlight); its
  style sheet is written to ``css/pygments.css``.
* ``zh.md``: README.zh-CN.md, the Chinese quick start, with its links turned into links inside
  the site (or, for files outside docs/, their repository paths as text).

It also makes the headings' ids valid CSS selectors (:func:`css_safe_slug`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# Training steps of the tiny models behind the attention figures (a few seconds each). The
# docs-build test lowers it through the environment: it checks that the site builds, while
# tests/test_plots.py checks the figures themselves.
STEPS = int(os.environ.get("POSENC_DOCS_TRAIN_STEPS", "120"))

# name -> (figure kind, options), sized down from the CLI defaults to keep the build quick.
DOC_FIGURES: dict[str, tuple[str, dict[str, Any]]] = {
    "table": ("table", {}),
    "similarity": ("similarity", {}),
    "wavelengths": ("wavelengths", {}),
    "bias": ("bias", {}),
    "attention-rope": ("attention", {"encoding": "rope", "train_len": 24, "steps": STEPS}),
    "attention-shaw": ("attention", {"encoding": "shaw", "train_len": 24, "steps": STEPS}),
}
DOC_DPI = 80

# MathJax: the distribution that ships it, and what of its es5/ folder the pages use: the
# combined TeX-to-SVG component (mkdocs.yml loads it) and what it loads on demand (TeX
# extensions through autoload, the menu's accessibility and speech parts), with the license.
MATHJAX_DIST = "django-static-mathjax"
MATHJAX_ES5 = "mathjax/static/mathjax/es5"
MATHJAX_PARTS = ("tex-svg.js", "input/tex/extensions", "a11y", "ui", "sre", "../LICENSE")
MATHJAX_DEST = "javascripts/mathjax"

# Pygments styles of css/pygments.css: the theme's light mode, and its dark mode.
PYGMENTS_LIGHT, PYGMENTS_DARK = "default", "github-dark"

ZH_README = ROOT / "README.zh-CN.md"

_cache: dict[str, bytes] = {}  # `mkdocs serve` rebuilds often; the figures do not change


def _png(name: str) -> bytes:
    if name not in _cache:
        import torch

        from posenc.plots import make_figure
        from posenc.plots.common import figure_png_bytes

        kind, options = DOC_FIGURES[name]
        torch.manual_seed(0)
        _cache[name] = figure_png_bytes(make_figure(kind, **options), dpi=DOC_DPI)
    return _cache[name]


def mathjax_files() -> dict[str, Path]:
    """Site path -> installed file of every MathJax file the site ships."""
    from importlib import metadata

    from mkdocs.exceptions import PluginError

    try:
        es5 = Path(str(metadata.distribution(MATHJAX_DIST).locate_file(MATHJAX_ES5)))
    except metadata.PackageNotFoundError:
        raise PluginError(
            f"the docs typeset their formulas with MathJax from the {MATHJAX_DIST} package, "
            "which is not installed; install the docs extra: pip install -e '.[docs]'"
        ) from None
    out: dict[str, Path] = {}
    for part in MATHJAX_PARTS:
        src = es5 / part
        if not src.exists():
            raise PluginError(f"{MATHJAX_DIST} lacks {src} (MathJax 3's es5 build)")
        for path in sorted(src.rglob("*")) if src.is_dir() else [src]:
            if path.is_file():
                rel = path.name if part.startswith("../") else path.relative_to(es5).as_posix()
                out[f"{MATHJAX_DEST}/{rel}"] = path
    return out


def pygments_css() -> str:
    """Style sheet of the Pygments classes in ``.highlight`` blocks, light and dark."""
    from pygments.formatters import HtmlFormatter

    light = HtmlFormatter(style=PYGMENTS_LIGHT).get_style_defs(".highlight")
    dark = HtmlFormatter(style=PYGMENTS_DARK).get_style_defs('[data-bs-theme="dark"] .highlight')
    return f"/* Pygments: {PYGMENTS_LIGHT} (light), {PYGMENTS_DARK} (dark) */\n{light}\n{dark}\n"


_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")


def zh_page(readme: str) -> str:
    """README.zh-CN.md as the page ``zh.md``: a link to ``README.md`` goes to the home page, a
    link to ``docs/X`` to the page ``X``, and a link to another file of the repository (outside
    docs/, so not in the site) becomes that file's path as code. Web links and anchors stay."""

    def fix(m: re.Match[str]) -> str:
        text, target = m.group(1), m.group(2)
        if re.match(r"[a-z][a-z0-9+.-]*:|#", target):
            return m.group(0)
        path, sep, anchor = target.partition("#")
        if path == "README.md":
            return f"[{text}](index.md{sep}{anchor})"
        if path.startswith("docs/"):
            return f"[{text}]({path.removeprefix('docs/')}{sep}{anchor})"
        return f"`{path}`" if text.strip("`") == path else f"{text}（`{path}`）"

    return _LINK.sub(fix, readme)


def css_safe_slug(value: str, separator: str) -> str:
    """Python-Markdown's heading slug, with ``_`` before one that starts with a digit: the
    theme's scrollspy looks each table-of-contents target up as a CSS selector, and ``#1-order``
    is not one (a heading such as "1. Order" then stops the page's scripts with an error)."""
    from markdown.extensions.toc import slugify

    slug = slugify(value, separator)
    return f"_{slug}" if slug[:1].isdigit() else slug


def on_config(config: Any) -> Any:
    config.mdx_configs.setdefault("toc", {})["slugify"] = css_safe_slug
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for name in DOC_FIGURES:
        files.append(File.generated(config, f"img/{name}.png", content=_png(name)))
    for dest, src in mathjax_files().items():
        files.append(File.generated(config, dest, abs_src_path=str(src)))
    files.append(File.generated(config, "css/pygments.css", content=pygments_css()))
    if ZH_README.exists():
        zh = zh_page(ZH_README.read_text(encoding="utf-8"))
        files.append(File.generated(config, "zh.md", content=zh))
    return files


def on_serve(server: Any, config: Any, builder: Any) -> Any:
    server.watch(str(ZH_README))  # `mkdocs serve` rebuilds zh.md when the README changes
    return server
