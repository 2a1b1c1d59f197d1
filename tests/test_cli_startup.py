"""The CLI starts without torch: help, ``posenc list`` and argument errors import none of it
(torch's import is ~2-4 s of CPU; posenc's own modules ~0.25 s). Each case runs in a fresh
interpreter, since this test process has torch loaded already. Time is measured in
benchmarks/cli_startup.py, not asserted here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import posenc
from posenc import catalog, registry

HEAVY = ("torch", "numpy", "matplotlib", "transformers", "triton")

# A fresh Python runs the CLI in-process and prints which heavy modules it imported.
_PROBE = """
import json, sys
from posenc.cli import app
try:
    app(sys.argv[1:], standalone_mode=False)
except BaseException:
    pass
print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))
"""


def _imported(*args: str) -> list[str]:
    code = _PROBE.format(heavy=HEAVY)
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("--version",),
        ("lab", "--help"),
        ("lab", "--bogus"),
        ("bench", "rope", "--help"),
        ("extend", "--help"),
        ("extend", "run", "--help"),
        ("plot", "--help"),
        ("demo", "order", "--help"),
        ("inspect", "--help"),
        ("explore", "--help"),
        ("kernels", "--help"),
        ("list",),
        ("list", "rpoe"),
        ("no-such-command",),
    ],
)
def test_cli_imports_no_torch(args: tuple[str, ...]) -> None:
    assert _imported(*args) == []


def test_import_posenc_needs_no_torch_until_used() -> None:
    code = (
        "import sys, posenc; a = 'torch' in sys.modules; posenc.Attention; "
        "print(a, 'torch' in sys.modules, posenc.names()[:2])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "['none',", "'sinusoidal']"]


def test_catalog_equals_the_live_registry() -> None:
    """The rows ``posenc list`` shows without importing the families are the registry's own
    (regenerate with ``python -m posenc.catalog`` after changing an encoding)."""
    live = [r for r in catalog.live_rows() if r.origin == "posenc"]
    assert list(catalog.BUILTIN) == live


def test_lazy_public_names() -> None:
    assert posenc.build is registry.build and posenc.names is registry.names
    assert {"Attention", "TransformerLM", "build"} <= set(dir(posenc))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        posenc.nope  # noqa: B018
