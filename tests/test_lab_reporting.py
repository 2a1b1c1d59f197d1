"""What the lab says while it runs: an unknown encoding's refusal (closest names, --import),
the `posenc` logger hierarchy, and plain progress lines with the cell's name when the output
is not a terminal."""

from __future__ import annotations

import difflib

import pytest
from typer.testing import CliRunner

from posenc import registry
from posenc.cli import app


@pytest.mark.parametrize("name", ["foo", "ropee", "t6"])
def test_an_unknown_encoding_suggests_the_closest_names_and_import(name, tmp_path):
    res = CliRunner().invoke(app, ["lab", "-e", f"none,{name}", "--dry-run", "-o", str(tmp_path)])
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    closest = difflib.get_close_matches(name, registry.names(), n=3, cutoff=0.0)
    assert closest and f"did you mean {' or '.join(map(repr, closest))}?" in res.output
    assert f"unknown encoding {name!r}" in res.output and "--import MODULE" in res.output
