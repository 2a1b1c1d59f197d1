"""Adding a bias is one file: a module defining its term and a ``register`` call, imported from a
folder of its own, runs through ``Attention`` (SDPA, explicit, FlexAttention), the lab grid, the
bias plot and the bias bench, and each gives the numbers of the term's formula (a naive loop).

Also: registration lives beside each family (the registry imports none of them), and the
consumers read the registry's list of biases instead of keeping their own."""

from __future__ import annotations

import ast
import importlib.util
import math
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from posenc import Attention, registry

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

NAME = "quadratic"
SCALE = 0.01

# The whole of a new bias: its term and its registration.
BIAS_FILE = f'''
"""A quadratic distance penalty, ``B[h, i, j] = -scale_h * (i - j) ** 2``, learned per head."""

import torch
from torch import nn

from posenc.bias import PositionBias
from posenc.registry import BuildContext, register


class Quadratic(PositionBias):
    def __init__(self, num_heads: int, init: float = {SCALE}) -> None:
        super().__init__(num_heads)
        self.scale = nn.Parameter(torch.full((num_heads,), init) * torch.arange(1, num_heads + 1))

    def term(self, device):
        scale = self.scale

        def quadratic(q_pos, k_pos, head):
            return -scale[head] * (q_pos - k_pos).to(torch.float32) ** 2

        return quadratic


@register("{NAME}", "bias", description="quadratic distance penalty, one scale per head")
def _build(ctx: BuildContext, *, init: float = {SCALE}) -> Quadratic:
    return Quadratic(ctx.num_heads, init=init)
'''


@pytest.fixture
def quadratic(tmp_path):
    """The new bias registered from its own file (and unregistered afterwards)."""
    path = tmp_path / "plugin" / "quadratic_bias.py"
    path.parent.mkdir()
    path.write_text(textwrap.dedent(BIAS_FILE))
    spec = importlib.util.spec_from_file_location("quadratic_bias", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["quadratic_bias"] = module  # as an import does (TorchDynamo looks it up there)
    spec.loader.exec_module(module)
    try:
        yield module
    finally:
        registry.unregister(NAME)
        sys.modules.pop("quadratic_bias", None)


def naive_bias(enc, positions, k_positions) -> torch.Tensor:
    """``-scale_h (i - j)^2`` entry by entry in float64, from the formula (not the term)."""
    scale = enc.scale.detach().double().tolist()
    q, k = positions.tolist(), k_positions.tolist()
    out = torch.empty(len(scale), len(q), len(k), dtype=torch.float64)
    for h, sh in enumerate(scale):
        for a, i in enumerate(q):
            for c, j in enumerate(k):
                out[h, a, c] = -sh * (i - j) ** 2
    return out


def naive_attention(attn: Attention, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Causal multi-head attention written out, with ``bias [h, s, s]`` on the logits."""
    b, s, _ = x.shape
    h, d = attn.num_heads, attn.head_dim
    q = attn.q_proj(x).view(b, s, h, d).transpose(1, 2).double()
    k = attn.k_proj(x).view(b, s, -1, d).transpose(1, 2).double()
    v = attn.v_proj(x).view(b, s, -1, d).transpose(1, 2).double()
    k, v = (t.repeat_interleave(h // t.shape[1], dim=1) for t in (k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(d) + bias
    future = torch.ones(s, s, dtype=torch.bool).triu(1)
    out = scores.masked_fill(future, float("-inf")).softmax(-1) @ v  # [b, h, s, d]
    return attn.o_proj(out.transpose(1, 2).reshape(b, s, h * d).float())


def test_registered_everywhere_the_biases_are_listed(quadratic) -> None:
    from posenc.bench import bias as bench
    from posenc.plots.bias import available_bias_kinds

    assert registry.names("bias")[-1] == NAME and registry.entry(NAME).family == "bias"
    assert registry.options(NAME) == {"init": SCALE}
    assert NAME in available_bias_kinds() and NAME in bench.BIASES
    assert NAME in bench.parse_biases("all")
    assert bench.plan_cases("quick")[0].biases[-1] == NAME


def test_materialized_bias_and_score_mod_are_the_terms(quadratic) -> None:
    enc = registry.build(NAME, dim=18, num_heads=3)
    positions, k_positions = torch.arange(4, 9), torch.tensor([0, 2, 3, 7, 8, 11])
    want = naive_bias(enc, positions, k_positions)  # [h, s, t]
    got = enc.bias(positions, k_positions)
    assert got.shape == (3, 5, 6) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)
    batched = enc.bias(torch.stack([positions, positions + 3]), k_positions)  # [2, h, s, t]
    torch.testing.assert_close(batched[1].double(), naive_bias(enc, positions + 3, k_positions))
    score_mod = enc.score_mod(positions, k_positions)
    for h, i, j in ((0, 0, 0), (2, 4, 5), (1, 3, 1)):
        t = torch.tensor
        entry = score_mod(t(1.0), t(0), t(h), t(i), t(j))
        assert float(entry) == pytest.approx(1.0 + float(want[h, i, j]), rel=1e-6, abs=1e-6)
    # Gradients reach the scales through the materialized bias.
    enc.bias(positions, k_positions).sum().backward()
    assert enc.scale.grad is not None and bool((enc.scale.grad != 0).all())


@pytest.mark.parametrize("backend", ["sdpa", "explicit", "flex"])
def test_attention_adds_the_terms(quadratic, backend: str) -> None:
    torch.manual_seed(0)
    enc = registry.build(NAME, dim=32, num_heads=4)
    attn = Attention(32, 4, 2, causal=True, encoding=enc, backend=backend)
    x = torch.randn(2, 12, 32)
    with torch.no_grad():
        got = attn(x)
        want = naive_attention(attn, x, naive_bias(enc, torch.arange(12), torch.arange(12)))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_the_bias_plot_draws_the_terms(quadratic) -> None:
    pytest.importorskip("matplotlib")
    from posenc.plots.bias import bias_caption, bias_data, draw_bias

    data = bias_data(kinds=[NAME], num_heads=2, length=10, causal=True)
    maps = data["bias"][NAME]  # [h, s, s], future keys NaN
    want = naive_bias(data["modules"][NAME], torch.arange(10), torch.arange(10)).numpy()
    keep = ~torch.ones(10, 10, dtype=torch.bool).triu(1).numpy()
    assert abs(maps[:, keep] - want[:, keep]).max() < 1e-5 * abs(want).max()
    assert NAME in bias_caption([NAME])
    fig = draw_bias(data)
    assert len(fig.axes) >= 2
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_the_bias_bench_runs_it(quadratic) -> None:
    from posenc.bench import bias as bench

    cases = bench.plan_cases("quick", lengths=[64], biases=[NAME])
    rows = bench.run_bias_bench(cases, heads=2, head_dim=16, repeats=2, compile_flex=False)
    assert [(r.s, r.bias) for r in rows] == [(64, NAME)]
    (row,) = rows
    assert row.materialized.ok and row.flex.ok and row.max_abs_diff < 1e-4


def test_the_lab_grid_trains_it(quadratic, tmp_path, monkeypatch, write_corpus) -> None:
    from posenc.lab.cells import presets as P
    from posenc.lab.grid.experiment import RunOptions, run_grid

    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    cfg = replace(
        P.LabConfig(),
        preset="test",
        encodings=(NAME, f"{NAME}:init=0.05"),
        train_len=16,
        model=P.ModelShape(dim=32, num_layers=1, num_heads=2),
        train=P.TrainConfig(steps=3, batch_size=2, warmup_steps=1),
        data=P.DataConfig(source="text", path=str(write_corpus(tmp_path, limit=3))),
        eval=P.EvalConfig(lengths=("1x", "2x"), tokens=64, batch_tokens=64, curve_points=4),
    )
    summary = run_grid(cfg, RunOptions(out=tmp_path / "out", quiet=True))
    assert not summary.failed, summary.failed
    assert summary.trained == [f"{NAME} (seed 0)", f"{NAME}:init=0.05 (seed 0)"]
    for row in summary.rows:
        bits = row["eval"]["variants"]["base"]["results"]["32"]["bits"]
        assert math.isfinite(bits) and bits > 0  # a bias: runs past the train length


# --- registration beside each family -------------------------------------------------------

SRC = Path(__file__).resolve().parents[1] / "src" / "posenc"


def imported_modules(path: Path) -> set[str]:
    """The posenc modules a file imports, anywhere in it (function-level imports too)."""
    package = ["posenc", *path.relative_to(SRC).with_suffix("").parts][:-1]
    if path.name == "__init__.py":
        package = ["posenc", *path.parent.relative_to(SRC).parts]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            mod = ".".join([*base, *(node.module.split(".") if node.module else [])])
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("posenc")}


def test_the_registry_imports_no_family_and_each_family_registers_itself() -> None:
    families = ("absolute", "bias", "relative", "rotary", "attention", "entries")
    reached = imported_modules(SRC / "registry.py")
    assert not [m for m in reached if m.split(".")[1:2] and m.split(".")[1] in families], reached
    for family in ("absolute", "bias", "relative", "rotary"):
        registering = [
            p
            for p in (SRC / family).glob("*.py")
            if "posenc.registry.register" in imported_modules(p)
        ]
        assert registering, f"posenc.{family} registers nothing"
    by_family = {f: registry.names(f) for f in registry.FAMILIES}
    assert by_family["bias"] == ["alibi", "t5", "kerple", "fire", "sandwich"]
    assert registry.names() == [n for f in registry.FAMILIES for n in by_family[f]]


#: Lists of the biases still kept, with the reason: the lab's default grid is configuration
#: data that reads no registry (its table order and identities are fixed by it).
KEPT = {"lab/cells/config.py"}


def test_consumers_read_the_list_of_biases_from_the_registry() -> None:
    """No module keeps its own list of the bias encodings (a second list is a future
    disagreement: a new bias missing from a plot, a bench or the lab)."""
    biases = registry.names("bias")
    restated = []
    paths = [p for p in SRC.rglob("*.py") if p.relative_to(SRC).as_posix() not in KEPT]
    for path in [*paths, SRC.parents[1] / "benchmarks" / "gpu_check.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List)):
                names = [e.value for e in node.elts if isinstance(e, ast.Constant)]
                if set(biases) <= set(names):
                    restated.append(f"{path.name}:{node.lineno}")
    assert not restated, restated
