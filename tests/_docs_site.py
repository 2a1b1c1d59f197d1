"""The documentation site, built once per test session for every test that reads it.

``mkdocs build --strict`` takes tens of seconds on two cores, so the docs tests share one build:
the first caller builds under a file lock, later callers (other tests, other xdist workers of
the same session) read its result.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent


class Build(NamedTuple):
    site: Path  # the built site
    returncode: int
    log: str  # mkdocs' stdout and stderr


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, at worst each worker builds its own copy
        yield
        return
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_site(tmp_path_factory: pytest.TempPathFactory) -> Build:
    """The site built by ``mkdocs build --strict`` from this checkout (once per session)."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    pytest.importorskip("matplotlib")
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the session's folder, shared by its workers (and only by them)
    out = base / "docs-build"
    out.mkdir(exist_ok=True)
    site, rc_file, log_file = out / "site", out / "returncode", out / "log"
    with _locked(out / "lock"):
        if not rc_file.exists():
            # Quick tiny models for the attention figures (docs/hooks.py); the figures are tested
            # in test_plots.py, the docs tests check the site.
            env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "POSENC_DOCS_TRAIN_STEPS": "3"}
            result = subprocess.run(
                [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            log_file.write_text(result.stdout + result.stderr, encoding="utf-8")
            rc_file.write_text(str(result.returncode))
    return Build(site, int(rc_file.read_text()), log_file.read_text(encoding="utf-8"))
