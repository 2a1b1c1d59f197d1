"""The built documentation site works with no network: every script, style sheet, font and image
a page loads is a file of the site (MathJax included, copied by docs/hooks.py from the installed
``django-static-mathjax`` package), and where Debian's ``chromium`` is installed, every formula
of every page with math is typeset by that MathJax with no request leaving the site.

The site is the one build of the session (tests/_docs_site.py), shared with tests/test_docs.py.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import shutil
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from _docs_site import ROOT, build_site

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# What a page fetches by itself (links to other sites, <a href>, are fine offline).
LOADING_LINK_RELS = {"stylesheet", "preload", "modulepreload", "icon", "shortcut", "prefetch"}
CSS_URL = re.compile(r"""url\(\s*(['"]?)(.*?)\1\s*\)""", re.S)
CSS_IMPORT = re.compile(r"""@import\s+(['"])(.*?)\1""")  # @import url(...) is a url()


def is_remote(url: str) -> bool:
    """A URL fetched from the network: ``http(s):``, protocol-relative ``//``, or another
    scheme that is not ``data:``/``blob:``/``file:``/``about:``."""
    url = url.strip()
    if url.startswith("//"):
        return True
    scheme = urlsplit(url).scheme.lower()
    return bool(scheme) and scheme not in ("data", "blob", "file", "about", "javascript")


class _Loads(HTMLParser):
    """The URLs an HTML page loads by itself: scripts, style sheets (and preloads, icons), images,
    frames, media, and the url()/@import of inline <style> and style="..." attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str]] = []  # (what, url)
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "script" and a.get("src"):
            self.urls.append(("script", a["src"]))
        elif tag == "link" and LOADING_LINK_RELS & set(a.get("rel", "").lower().split()):
            self.urls.append((f"link rel={a['rel']}", a.get("href", "")))
        elif tag in ("img", "iframe", "source", "video", "audio", "embed") and a.get("src"):
            self.urls.append((tag, a["src"]))
        elif tag == "object" and a.get("data"):
            self.urls.append((tag, a["data"]))
        if a.get("style"):
            self.urls += [("style attribute", u) for u in css_urls(a["style"])]
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.urls += [("<style>", u) for u in css_urls(data)]


def css_urls(css: str) -> list[str]:
    """Every url(...) and @import target of a style sheet (comments dropped)."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    return [m.group(2) for m in (*CSS_URL.finditer(css), *CSS_IMPORT.finditer(css))]


def page_loads(html: str) -> list[tuple[str, str]]:
    parser = _Loads()
    parser.feed(html)
    return parser.urls


def local_target(site: Path, page: Path, url: str) -> Path:
    """The file a local URL of ``page`` names (query and fragment dropped; ``/x`` is the site's)."""
    path = unquote(urlsplit(url).path)
    return (site / path.lstrip("/") if path.startswith("/") else page.parent / path).resolve()


def test_checker_sees_remote_loads() -> None:
    """The checks are not vacuous: each kind of remote load is seen, local ones are not."""
    html = """<html><head>
      <script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js"></script>
      <link rel="stylesheet" href="//cdnjs.cloudflare.com/x.css">
      <link rel="icon" href="http://example.org/favicon.ico">
      <link rel="canonical" href="https://example.org/page/">
      <style>@import url("https://fonts.googleapis.com/css?family=Lato"); b {color: red}</style>
      <script src="../js/local.js"></script><link rel="stylesheet" href="css/base.css">
      </head><body><img src="img/a.png"><a href="https://example.org">a link</a>
      <div style="background: url(http://example.org/bg.png)"></div></body></html>"""
    remote = [u for _, u in page_loads(html) if is_remote(u)]
    assert remote == [
        "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js",
        "//cdnjs.cloudflare.com/x.css",
        "http://example.org/favicon.ico",
        "https://fonts.googleapis.com/css?family=Lato",
        "http://example.org/bg.png",
    ]
    css = """/* see http://example.org */ @font-face { src: url(../webfonts/fa.woff2),
      url('https://fonts.gstatic.com/s/lato.woff2') format("woff2"); }
      @import 'https://example.org/more.css';
      .x { background: url("data:image/svg+xml,%3csvg xmlns='http://www.w3.org/2000/svg'%3e") }"""
    assert [u for u in css_urls(css) if is_remote(u)] == [
        "https://fonts.gstatic.com/s/lato.woff2",
        "https://example.org/more.css",
    ]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = build_site(tmp_path_factory)
    assert built.returncode == 0, built.log[-4000:]
    return built.site


def test_pages_load_nothing_from_the_network(site: Path) -> None:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20
    remote, missing = [], []
    for page in pages:
        for what, url in page_loads(page.read_text(encoding="utf-8")):
            name = page.relative_to(site).as_posix()
            if is_remote(url):
                remote.append(f"{name}: {what} {url}")
            elif (
                url
                and not url.startswith(("data:", "#"))
                and not local_target(site, page, url).exists()
            ):
                missing.append(f"{name}: {what} {url}")
    assert not remote, remote[:20]
    assert not missing, missing[:20]  # a local load must be a file of the site


class _Links(HTMLParser):
    """Every ``<a href>`` of a page, and the text of its table-of-contents links
    (``a.nav-link`` whose href is an anchor of the page itself, the theme's sidebar)."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.toc: list[str] = []
        self._toc_link = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "a" and "href" in a:
            self.hrefs.append(a["href"])
            if "nav-link" in a.get("class", "").split() and a["href"].startswith("#"):
                self._toc_link = True
                self.toc.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._toc_link = False

    def handle_data(self, data: str) -> None:
        if self._toc_link:
            self.toc[-1] += data


def page_links(html: str) -> _Links:
    parser = _Links()
    parser.feed(html)
    return parser


def test_every_internal_link_resolves_to_a_file(site: Path) -> None:
    """The site opened from disk (file://): a link to a folder shows the folder's listing, not
    its index.html, so every internal link must name a file (mkdocs.yml:
    ``use_directory_urls: false``)."""
    pages = sorted(site.rglob("*.html"))
    checked, broken = 0, []
    for page in pages:
        for href in page_links(page.read_text(encoding="utf-8")).hrefs:
            if not href or href.startswith(("#", "mailto:", "javascript:")) or is_remote(href):
                continue
            checked += 1
            if not local_target(site, page, href).is_file():
                broken.append(f"{page.relative_to(site).as_posix()}: {href}")
    assert checked > 20 * len(pages) // 2, checked  # the navigation of every page is checked
    assert not broken, broken[:20]


def test_checker_sees_a_link_to_a_folder(tmp_path: Path) -> None:
    """The check is not vacuous: a directory-style link (what `use_directory_urls: true`
    writes) names a folder, which is no file."""
    (tmp_path / "guide").mkdir()
    (tmp_path / "guide" / "index.html").write_text("x")
    page = tmp_path / "index.html"
    links = page_links('<a href="guide/">a</a><a class="nav-link" href="#x">T <b>1</b></a>')
    assert links.hrefs == ["guide/", "#x"] and links.toc == ["T 1"]
    assert not local_target(tmp_path, page, "guide/").is_file()
    assert local_target(tmp_path, page, "guide/index.html").is_file()


def test_tables_of_contents_show_no_raw_tex(site: Path) -> None:
    """MathJax typesets the page's formulas, not the sidebar's table of contents, which shows a
    heading's TeX as written (``\\(m - n\\)``): headings carry no math."""
    raw = []
    for page in sorted(site.rglob("*.html")):
        for title in page_links(page.read_text(encoding="utf-8")).toc:
            if re.search(r"\\[(\[]|\$", title):
                raw.append(f"{page.relative_to(site).as_posix()}: {title.strip()}")
    assert not raw, raw
    tour = page_links((site / "tour" / "06-rope.html").read_text(encoding="utf-8")).toc
    assert any("m − n" in title for title in tour), tour  # the heading, in plain text


def test_style_sheets_fetch_no_fonts_or_imports_from_the_network(site: Path) -> None:
    sheets = sorted(site.rglob("*.css"))
    assert any(s.name == "pygments.css" for s in sheets)  # the code colours, written by the hook
    remote, missing = [], []
    for sheet in sheets:
        for url in css_urls(sheet.read_text(encoding="utf-8", errors="replace")):
            if is_remote(url):
                remote.append(f"{sheet.relative_to(site)}: {url}")
            elif not url.startswith(("data:", "#")) and not local_target(site, sheet, url).exists():
                missing.append(f"{sheet.relative_to(site)}: {url}")
    assert not remote, remote
    assert not missing, missing


def test_math_pages_load_the_shipped_mathjax(site: Path) -> None:
    mathjax = site / "javascripts" / "mathjax"
    assert (mathjax / "tex-svg.js").stat().st_size > 1_000_000
    assert (mathjax / "LICENSE").exists()
    assert (mathjax / "input" / "tex" / "extensions" / "boldsymbol.js").exists()  # autoloaded
    math_pages = [p for p in site.rglob("*.html") if 'class="arithmatex"' in p.read_text("utf-8")]
    assert len(math_pages) >= 6
    for page in math_pages:
        scripts = [u for what, u in page_loads(page.read_text("utf-8")) if what == "script"]
        loaded = {local_target(site, page, u) for u in scripts}
        assert (mathjax / "tex-svg.js").resolve() in loaded, page
    docs_extra = re.search(
        r"^docs = \[(.*?)\]$", (ROOT / "pyproject.toml").read_text(), re.M | re.S
    )
    assert docs_extra and '"django-static-mathjax' in docs_extra[1]


# In the page: wait for MathJax, then count formulas, typeset ones and errors.
MATH_PROBE = """
(async () => {
  if (!window.MathJax || !MathJax.startup) return JSON.stringify({mathjax: false});
  await MathJax.startup.promise;
  const all = [...document.querySelectorAll('.arithmatex')];
  const done = all.filter(e => e.querySelector('mjx-container svg'));
  const raw = all.filter(e => !e.querySelector('mjx-container')).map(e => e.textContent);
  const errors = [...document.querySelectorAll('[data-mml-node="merror"], [data-mjx-error]')]
    .map(e => e.closest('.arithmatex')?.textContent || e.textContent);
  const undefinedMacros = [...document.querySelectorAll('[data-mml-node="mtext"][fill="red"]')]
    .map(e => e.closest('.arithmatex')?.textContent);
  return JSON.stringify({mathjax: true, formulas: all.length, typeset: done.length, raw,
                         errors, undefinedMacros});
})()
"""


@contextlib.contextmanager
def serve(folder: Path) -> Iterator[str]:
    """``folder`` over HTTP on 127.0.0.1 (a free port) for the duration: the origin URL. As
    `mkdocs serve` or `python -m http.server` serve the site (the search box's web worker needs
    a server; the formulas are typeset from ``file:`` too)."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install -y chromium)"
)
def test_every_formula_is_typeset_offline_in_chromium(site: Path, tmp_path: Path) -> None:
    """Each page with math, served from 127.0.0.1: MathJax (the site's copy) typesets every
    formula, with no TeX error or undefined macro, no script error, and no request to any other
    origin. Chromium's networking extras are off (tests/_cdp.py)."""
    from _cdp import Chromium

    assert CHROMIUM is not None
    math_pages = sorted(
        p for p in site.rglob("*.html") if 'class="arithmatex"' in p.read_text("utf-8")
    )
    assert math_pages
    results = {}
    with serve(site) as origin:
        browser = Chromium(CHROMIUM, tmp_path / "profile")
        try:
            target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
                "sessionId"
            ]
            for domain in ("Runtime", "Page", "Network"):
                browser.send(f"{domain}.enable", session=session)
            for page in math_pages:
                name = page.relative_to(site).as_posix()
                browser.events.clear()
                browser.send("Page.navigate", {"url": f"{origin}/{name}"}, session=session)
                browser.wait_for("Page.loadEventFired")
                probe = browser.send(
                    "Runtime.evaluate",
                    {"expression": MATH_PROBE, "awaitPromise": True, "returnByValue": True},
                    session=session,
                )
                assert "exceptionDetails" not in probe, (name, probe)
                result = json.loads(probe["result"]["value"])
                result["requests"] = [
                    e["params"]["request"]["url"]
                    for e in browser.events
                    if e.get("method") == "Network.requestWillBeSent"
                ]
                result["exceptions"] = [
                    (details.get("exception") or {}).get("description", details.get("text", ""))
                    for e in browser.events
                    if e.get("method") == "Runtime.exceptionThrown"
                    for details in [e["params"]["exceptionDetails"]]
                ]
                results[name] = result
        finally:
            browser.close()
    for name, r in results.items():
        assert r["mathjax"], f"{name}: MathJax did not load"
        assert r["formulas"] > 0 and r["typeset"] == r["formulas"], (name, r["raw"][:5])
        assert not r["errors"] and not r["undefinedMacros"], (name, r)
        assert not r["exceptions"], (name, r["exceptions"])
        elsewhere = [u for u in r["requests"] if not u.startswith((f"{origin}/", "data:"))]
        assert not elsewhere, (name, elsewhere)
        assert f"{origin}/javascripts/mathjax/tex-svg.js" in r["requests"], name
