"""``posenc demo order``: without a position encoding, attention cannot tell orderings apart.

The same tokens in two orders go through the same random-weight *bidirectional* model. With NoPE
the per-token outputs of one ordering are exactly a permutation of the other's: the model is
order-blind. Every encoding breaks that, up to the symmetries it has: a bias that depends only on
the distance |i - j| when not causal (ALiBi, KERPLE, FIRE and Sandwich) cannot tell a sequence from
its reverse, which keeps every |i - j| (:func:`reversal_blind` finds them by running the demo). A
causal mask alone already breaks the symmetry, which is why the demo is bidirectional.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import typer

# torch and the model load inside the commands: `posenc --help` must not import torch.
from . import registry

DEFAULT_ORDERINGS = (("我 喜欢 学习 AI", "AI 学习 喜欢 我"), ("A B C D", "D C B A"))
BLIND_TOL = 1e-9  # float64 forward passes: a true permutation matches to ~1e-15


@dataclass(frozen=True)
class OrderResult:
    encoding: str
    family: str
    max_diff: float  # max |out_a[i] - out_b[perm(i)]| over tokens and channels

    @property
    def blind(self) -> bool:
        return self.max_diff < BLIND_TOL


def token_permutation(a: list[str], b: list[str]) -> list[int]:
    """Index in ``b`` of each token of ``a``; both must hold the same distinct tokens."""
    if len(set(a)) != len(a) or len(set(b)) != len(b):
        raise ValueError("each ordering must list distinct tokens, so that the matching is unique")
    if sorted(a) != sorted(b):
        raise ValueError(f"the orderings must hold the same tokens, got {a} and {b}")
    return [b.index(tok) for tok in a]


def order_sensitivity(
    encoding: str,
    ordering_a: list[str],
    ordering_b: list[str],
    *,
    seed: int = 0,
    dim: int = 32,
    num_heads: int = 4,
    num_layers: int = 2,
) -> OrderResult:
    """Run both orderings through one random bidirectional model with ``encoding`` (float64).

    Shapes: each ordering ``[s]`` tokens -> hidden ``[1, s, dim]``; compared token by token.
    """
    import torch

    from .model import ModelConfig, TransformerLM

    perm = token_permutation(ordering_a, ordering_b)
    vocab = {tok: i for i, tok in enumerate(sorted(set(ordering_a)))}
    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=len(vocab),
        dim=dim,
        num_layers=num_layers,
        num_heads=num_heads,
        max_len=max(16, len(ordering_a)),
        causal=False,
        encoding=encoding,
    )
    model = TransformerLM(cfg).double().eval()
    ta = torch.tensor([[vocab[t] for t in ordering_a]])
    tb = torch.tensor([[vocab[t] for t in ordering_b]])
    with torch.no_grad():
        ha, hb = model.hidden(ta)[0], model.hidden(tb)[0]  # [s, dim]
    diff = (ha - hb[perm]).abs().max().item()
    return OrderResult(encoding, registry.entry(encoding).family, diff)


def reversal_blind(encodings: list[str] | None = None, *, seed: int = 0) -> list[str]:
    """The encodings (other than ``none``) that cannot tell the default examples from their
    reversals: the demo's "order-blind" verdicts on :data:`DEFAULT_ORDERINGS`, in registry order.
    """
    found = []
    for name in registry.names() if encodings is None else encodings:
        if registry.entry(name).family == "none":
            continue
        if all(
            order_sensitivity(name, a.split(), b.split(), seed=seed).blind
            for a, b in DEFAULT_ORDERINGS
        ):
            found.append(name)
    return found


demo_app = typer.Typer(
    help="Small demonstrations of what position information does.", no_args_is_help=True
)


@demo_app.command("order")
def order(
    a: str = typer.Option(None, "--a", help="first ordering, tokens separated by spaces"),
    b: str = typer.Option(None, "--b", help="second ordering of the same tokens"),
    encodings: str = typer.Option("all", help="comma-separated encodings, or 'all' registered"),
    seed: int = typer.Option(0, help="seed of the random-weight model"),
) -> None:
    """Show that without an encoding the model cannot tell two orderings apart."""
    from rich.console import Console

    from .cli_errors import fail

    if (a is None) != (b is None):
        fail("give both --a and --b, or neither for the default examples")
    pairs = [(a, b)] if a is not None and b is not None else list(DEFAULT_ORDERINGS)
    try:
        names = _encoding_names(encodings)
        for sa, sb in pairs:
            token_permutation(sa.split(), sb.split())
    except ValueError as e:
        fail(str(e))
    console = Console()
    console.print(
        "Same tokens, two orders, one random-weight [bold]bidirectional[/] model per encoding "
        "(float64). [bold]order-blind[/] = the outputs of one ordering are exactly a permutation "
        "of the other's. (A causal mask alone already breaks the symmetry, hence no mask here.)"
    )
    for sa, sb in pairs:
        results = [order_sensitivity(n, sa.split(), sb.split(), seed=seed) for n in names]
        console.print(_order_table(f"{sa!r}  vs  {sb!r}", results))
        blind = [r.encoding for r in results if r.blind and r.family != "none"]
        if blind:
            console.print(
                f"Blind to this reordering besides NoPE: {', '.join(blind)} (a bias that depends "
                "only on |i - j| when not causal cannot tell a sequence from its reverse)."
            )


def _encoding_names(encodings: str) -> list[str]:
    """``'all'`` or comma-separated names (any case) -> registered names; ValueError if unknown."""
    if encodings.strip().lower() == "all":
        return registry.names()
    names = [registry.entry(e).name for e in encodings.split(",") if e.strip()]
    if not names:
        raise ValueError("--encodings names no encoding; pass names or 'all'")
    return list(dict.fromkeys(names))


def _order_table(title: str, results: list[OrderResult]) -> Any:
    from rich.table import Table

    table = Table(title=title)
    table.add_column("encoding")
    table.add_column("family")
    table.add_column("max |Δ| after matching tokens", justify="right")
    table.add_column("verdict")
    for r in results:
        verdict = "[red]order-blind[/]" if r.blind else "[green]tells them apart[/]"
        if r.blind and r.family != "none":
            verdict += " (symmetric under this reordering)"
        table.add_row(r.encoding, r.family, f"{r.max_diff:.3e}", verdict)
    return table
