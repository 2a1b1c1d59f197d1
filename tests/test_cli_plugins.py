"""Your own encoding from the command line: ``posenc lab -e mymod:myenc``, ``--import mymod``,
the ``posenc.encodings`` entry points of installed packages, and ``posenc list`` showing each
with where it came from. Refusals are one line; a broken entry point is one warning."""

from __future__ import annotations

import json
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posenc import registry
from posenc.cli import app
from posenc.plugins import is_module_label, module_label

MODULE = "posenc_test_plugin_enc"

# A bias class and nothing else: `-e module:LinearPenalty` registers it.
SOURCE = '''
"""A learned linear distance penalty."""

import torch
from torch import nn

from posenc.bias import PositionBias


class LinearPenalty(PositionBias):
    """-slope_h |i - j|, one learned slope per head."""

    def __init__(self, num_heads: int, slope: float = 0.1) -> None:
        super().__init__(num_heads)
        self.slope = nn.Parameter(torch.full((num_heads,), slope))

    def term(self, device):
        slope = self.slope

        def linear_penalty(q_pos, k_pos, head):
            return -slope[head] * (q_pos - k_pos).abs().to(torch.float32)

        return linear_penalty


class NoFamily(nn.Module):
    pass
'''

TINY = ("--steps", "2", "--dim", "16", "--layers", "1", "--heads", "2", "--train-len", "8",
        "--eval-lens", "8", "--eval-tokens", "16", "--seeds", "1", "--task", "copy",
        "--no-plots", "--rope-scalings", "none")  # fmt: skip


def invoke(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args), env={"COLUMNS": "250", "NO_COLOR": "1"})
    return res.exit_code, res.output


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The module on sys.path; whatever it registers is unregistered afterwards."""
    folder = tmp_path / "plugin"
    folder.mkdir()
    (folder / f"{MODULE}.py").write_text(textwrap.dedent(SOURCE))
    monkeypatch.syspath_prepend(str(folder))
    before = set(registry.names())
    yield MODULE
    for name in set(registry.names()) - before:
        registry.unregister(name)
    sys.modules.pop(MODULE, None)


def test_the_colon_rule() -> None:
    assert is_module_label("mymod:myenc") and is_module_label("my.mod:MyEnc:slope=2")
    assert not is_module_label("rope:base=500") and not is_module_label("rope")
    assert not is_module_label("rope:positions=pose:base=10")
    assert module_label("rope:base=500") == "rope:base=500"  # unchanged


@pytest.mark.parametrize(
    ("label", "needles"),
    [
        ("rope:base", ("'rope' is a registered encoding", "--import rope -e base")),
        ("my-mod:enc", ("module:encoding", "encoding:key=value")),
        ("nosuchmodule_zz:enc", ("no module named 'nosuchmodule_zz'",)),
        (f"{MODULE}:Nothere", (f"module {MODULE} neither registers", "'Nothere'")),
        (f"{MODULE}:NoFamily", ("NoFamily has family None",)),
    ],
)
def test_refused_labels_are_one_line(plugin, tmp_path: Path, label, needles) -> None:
    code, out = invoke("lab", "-e", label, "--out", str(tmp_path / "o"), "--dry-run", *TINY)
    lines = out.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), out
    for needle in needles:
        assert needle in lines[0], out


def test_module_colon_class_runs_in_the_lab(plugin, tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, text = invoke("lab", "-e", f"{MODULE}:LinearPenalty:slope=0.2", "--out", str(out),
                        "--quiet", *TINY)  # fmt: skip
    assert code == 0, text
    (row,) = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert row["encoding"] == "linearpenalty:slope=0.2" and row["family"] == "bias"
    assert row["encoding_kwargs"] == {"slope": 0.2}
    assert row["identity"]["train"]["code"]["module"] == MODULE
    assert registry.origin("linearpenalty") == MODULE


def test_a_class_registered_from_the_command_line_reaches_worker_processes(
    plugin, tmp_path: Path
) -> None:
    """``-e mymod:Class`` registers the class in this process; the lab's workers (fresh
    processes, ``--jobs 2``) import mymod, which does not register it: they find it through
    the registration this process left them (registry.CLASSES_ENV)."""
    out = tmp_path / "run"
    code, text = invoke("lab", "-e", f"{MODULE}:LinearPenalty,alibi", "--jobs", "2",
                        "--out", str(out), "--quiet", *TINY)  # fmt: skip
    assert code == 0, text
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["encoding"] for r in rows) == ["alibi", "linearpenalty"]


def test_import_then_a_registered_name(plugin, tmp_path: Path) -> None:
    """``--import mymod -e myenc`` where mymod registers myenc with ``register``."""
    mod = Path(sys.path[0]) / "posenc_test_plugin_reg.py"
    mod.write_text(
        "from posenc.registry import register_encoding_class\n"
        f"from {MODULE} import LinearPenalty\n"
        "register_encoding_class(LinearPenalty, 'penalty-reg')\n"
    )
    try:
        code, out = invoke("lab", "--import", "posenc_test_plugin_reg", "-e", "penalty-reg",
                           "--out", str(tmp_path / "o"), "--dry-run", *TINY)  # fmt: skip
        assert code == 0 and "penalty-reg" in out, out
    finally:
        sys.modules.pop("posenc_test_plugin_reg", None)


def test_list_shows_an_imported_encoding_and_where_it_came_from(plugin) -> None:
    (Path(sys.path[0]) / "posenc_test_plugin_list.py").write_text(
        f"from posenc.registry import register_encoding_class\nfrom {MODULE} import LinearPenalty"
        "\nregister_encoding_class(LinearPenalty, 'penalty-list')\n"
    )
    try:
        code, out = invoke("list", "penalty", "--import", "posenc_test_plugin_list")
        assert code == 0, out
        line = next(x for x in out.splitlines() if "penalty-list" in x)
        assert "bias" in line and "slope=0.1" in line and MODULE in line, out
        code, out = invoke("list", "--import", "no_such_module_zz")
        assert code == 2 and out.strip().splitlines() == [
            "error: --import no_such_module_zz: no module named 'no_such_module_zz' "
            "(is it on PYTHONPATH, or installed?)"
        ]
    finally:
        sys.modules.pop("posenc_test_plugin_list", None)


def test_import_shows_module_in_help() -> None:
    for command in (("lab", "--help"), ("list", "--help")):
        code, out = invoke(*command)
        assert code == 0
        line = next(x for x in out.splitlines() if x.strip("│ ").startswith("--import"))
        assert "MODULE" in line and "list[str]" not in out, line


# --- entry points --------------------------------------------------------------------------


@pytest.fixture
def installed(plugin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A package "posenc-test-plugins" installed (a .dist-info on sys.path) declaring three
    entry points: a class, a module that raises when imported, and a missing attribute."""
    site = tmp_path / "site"
    info = site / "posenc_test_plugins-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: posenc-test-plugins\n"
                                   "Version: 1.0\n")  # fmt: skip
    (info / "entry_points.txt").write_text(
        "[posenc.encodings]\n"
        f"ep-penalty = {MODULE}:LinearPenalty\n"
        "ep-broken = posenc_test_broken_plugin\n"
        f"ep-missing = {MODULE}:Missing\n"
    )
    (site / "posenc_test_broken_plugin.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "_ENTRY_POINTS_LOADED", False)
    yield
    sys.modules.pop("posenc_test_broken_plugin", None)
    for name in [n for n in registry.names() if n.startswith("ep-")]:
        registry.unregister(name)


def test_entry_points_load_on_an_unknown_name(installed) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        e = registry.entry("ep-penalty")  # not registered yet: the entry points are loaded
    assert e.family == "bias" and registry.options("ep-penalty") == {"slope": 0.1}
    assert registry.origin("ep-penalty").startswith("entry point ep-penalty = ")
    assert "posenc-test-plugins" in registry.origin("ep-penalty")
    messages = [str(w.message) for w in caught if issubclass(w.category, registry.PluginWarning)]
    assert len(messages) == 2, messages  # one each: the module that raised, the missing name
    assert any("ep-broken" in m and "RuntimeError: boom" in m for m in messages)
    assert any("ep-missing" in m for m in messages)
    with pytest.raises(ValueError, match="unknown encoding 'nothere'"):
        registry.entry("nothere")  # loaded once: no second round of warnings


def test_list_and_lab_see_entry_points(installed, tmp_path: Path) -> None:
    code, out = invoke("list", "ep-")
    assert code == 0 and "Traceback" not in out, out
    warns = [x for x in out.splitlines() if x.startswith("warning: ")]
    assert len(warns) == 2 and any("ep-broken" in w for w in warns), out
    line = next(x for x in out.splitlines() if "ep-penalty" in x)
    assert "entry point" in line and "bias" in line, out
    code, out = invoke("lab", "-e", "ep-penalty", "--out", str(tmp_path / "o"), "--dry-run",
                       *TINY)  # fmt: skip
    assert code == 0 and "ep-penalty" in out, out


def test_lab_extend_imports_first(plugin, tmp_path: Path) -> None:
    """``posenc lab extend --import mymod``: the module is imported before the grid is read (its
    registration happens; then the missing grid is the one-line error), and a module that is
    not there is refused in one line."""
    mod = Path(sys.path[0]) / "posenc_test_plugin_ext.py"
    mod.write_text(
        "from posenc.registry import register_encoding_class\n"
        f"from {MODULE} import LinearPenalty\n"
        "register_encoding_class(LinearPenalty, 'penalty-ext')\n"
    )
    try:
        code, out = invoke("lab", "extend", "--import", "posenc_test_plugin_ext", "--out",
                           str(tmp_path / "empty"))  # fmt: skip
        assert code != 0 and "penalty-ext" in registry.names(), out
        assert len(out.strip().splitlines()) == 1 and "Traceback" not in out, out
    finally:
        sys.modules.pop("posenc_test_plugin_ext", None)
    code, out = invoke("lab", "extend", "--import", "no_such_module_here")
    assert code == 2 and out.strip().splitlines() == [
        "error: --import no_such_module_here: no module named 'no_such_module_here' (is it on "
        "PYTHONPATH, or installed?)"
    ], out
