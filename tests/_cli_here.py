"""The ``posenc`` command run in the test's own process (typer's CliRunner): no interpreter to
start and no torch to import again (3.4 s of CPU a process on the 2-core VM). The tests that
kill a run start that run as a process of its own; what reads its folder afterwards (a
refusal, a resume, a reference run) runs here."""

from __future__ import annotations

from typing import Any


def posenc_here(*args: str, code: int = 0) -> str:
    """``posenc ARGS`` in this process; its output (stdout and stderr), after checking that it
    exited with ``code``."""
    from typer.testing import CliRunner

    from posenc.cli import app

    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == code, f"exit {res.exit_code}, want {code}: {res.output}"
    return res.output


def cli(*args: str) -> Any:
    """``posenc ARGS`` in this process: typer's result (exit code, output, exception)."""
    from typer.testing import CliRunner

    from posenc.cli import app

    return CliRunner().invoke(app, list(args))


def one_line_error(result: Any, *needles: str) -> str:
    """The one ``error:`` line of a refused command (exit 2), which names every needle."""
    assert result.exit_code == 2, (result.output, result.exception)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return str(lines[0])
