"""posenc's own encodings as ``posenc list`` shows them, without importing them (nor torch).

The registry is the source: :data:`BUILTIN` is generated from it (``python -m posenc.catalog``
rewrites this file) and a test checks the two are equal, so the catalog cannot drift. ``posenc
list`` reads it when nothing else can add an encoding (no ``--import``, no installed entry
point, no class remembered by name); otherwise it asks the live registry.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NamedTuple


class Row(NamedTuple):
    """One line of ``posenc list``: options are ``key=default`` in the builder's order."""

    name: str
    family: str
    shared: bool
    options: str
    description: str
    origin: str


def live_rows(names: list[str] | None = None) -> list[Row]:
    """The rows of the live registry (imports the families, hence torch)."""
    from . import registry

    rows = []
    for name in registry.names() if names is None else names:
        e = registry.entry(name)
        opts = ", ".join(f"{k}={v!r}" for k, v in registry.options(name).items())
        rows.append(Row(name, e.family, e.shared, opts, e.description, registry.origin(name)))
    return rows


def only_builtins() -> bool:
    """Whether the registry would hold posenc's own encodings only: no installed entry point of
    the group and no class remembered by name in the environment (``--import`` is the caller's
    to check)."""
    from importlib.metadata import entry_points

    from .registry import CLASSES_ENV, ENTRY_POINT_GROUP

    return not os.environ.get(CLASSES_ENV) and not list(entry_points(group=ENTRY_POINT_GROUP))


#: Everything below this line is generated (spelled in two parts so it occurs once).
_MARKER = "# BEGIN " + "GENERATED"


def _source(rows: list[Row]) -> str:
    text = Path(__file__).read_text()
    head = text[: text.index(_MARKER)]
    body = "".join(f"        {tuple(r)!r},\n" for r in rows)
    return f"{head}{_MARKER}\nBUILTIN: tuple[Row, ...] = tuple(\n    Row(*r)\n    for r in (\n{body}    )\n)\n"


if __name__ == "__main__":  # regenerate: python -m posenc.catalog
    Path(__file__).write_text(_source([r for r in live_rows() if r.origin == "posenc"]))
    sys.exit(0)

# BEGIN GENERATED
BUILTIN: tuple[Row, ...] = tuple(
    Row(*r)
    for r in (
        ("none", "none", True, "", "NoPE: no position information", "posenc"),
        (
            "sinusoidal",
            "absolute",
            True,
            "base=10000.0, layout='interleaved', scale_input=False",
            "Vaswani et al. sin/cos table added to embeddings",
            "posenc",
        ),
        (
            "learned",
            "absolute",
            True,
            "max_positions=None, init_std=0.02",
            "learned table (GPT-2/BERT), max_len positions",
            "posenc",
        ),
        (
            "rope",
            "rotary",
            True,
            "base=10000.0, scaling=None, layout='half', rotary_dim=None, partial_rotary_factor=None, angle_dtype='float64', cache_len=None",
            "RoPE: half/interleaved, partial, PI/NTK/dynamic NTK/YaRN/LongRoPE/Llama-3 scaling",
            "posenc",
        ),
        (
            "mrope",
            "rotary",
            True,
            "base=10000.0, mrope_section=None, interleaved=False, scaling=None, angle_dtype='float64'",
            "M-RoPE (Qwen2-VL/Qwen3-VL): T/H/W sections of pairs; on text, plain RoPE",
            "posenc",
        ),
        (
            "xpos",
            "rotary",
            True,
            "base=10000.0, scale_base=512.0, gamma=0.4, layout='interleaved', center=None",
            "xPos: RoPE whose scores decay exponentially with distance",
            "posenc",
        ),
        (
            "alibi",
            "bias",
            True,
            "",
            "ALiBi: -m_h * distance, paper slopes; symmetric when not causal",
            "posenc",
        ),
        (
            "t5",
            "bias",
            True,
            "num_buckets=32, max_distance=128, bidirectional=None",
            "T5 bucketed relative bias, one table shared by all layers",
            "posenc",
        ),
        (
            "kerple",
            "bias",
            False,
            "variant='log', eps=0.01",
            "KERPLE log/power kernel bias, per layer",
            "posenc",
        ),
        (
            "fire",
            "bias",
            True,
            "mlp_width=32, init_c=0.1, init_threshold=512.0",
            "FIRE: MLP over progressively interpolated distance, shared",
            "posenc",
        ),
        (
            "sandwich",
            "bias",
            True,
            "d_prime=128, base=10000.0",
            "Sandwich: sinusoidal dot-product bias, per-head ratios",
            "posenc",
        ),
        (
            "shaw",
            "relative",
            False,
            "max_distance=16, values=True, per_head=False",
            "Shaw et al.: clipped relative key/value embeddings",
            "posenc",
        ),
        (
            "transformer-xl",
            "relative",
            False,
            "base=10000.0",
            "Transformer-XL: sinusoidal R, u/v biases, rel-shift, segment memory",
            "posenc",
        ),
        (
            "deberta",
            "relative",
            True,
            "position_buckets=256, max_relative_positions=512, pos_att_type='c2p|p2c', norm_rel_ebd=True",
            "DeBERTa-v3 disentangled c2p/p2c, log buckets, shared table",
            "posenc",
        ),
        (
            "cope",
            "relative",
            False,
            "npos_max=None, init_std=0.02",
            "CoPE: contextual positions from gated counts (Golovneva et al. 2024)",
            "posenc",
        ),
    )
)
