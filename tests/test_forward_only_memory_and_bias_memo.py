"""Two per-forward paths of Attention against naive loops written out here:

* a rotary module that has only ``forward`` (no ``tables``/``prepare``), given Transformer-XL
  memory at positions of its own: the memory's keys must rotate by ``memory_positions``;
* the memo of materialized biases (and score_mods) that layers of one forward share: two
  different bias encodings of the same shape in one forward must each get their own entry.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import nn

from posenc import Attention
from posenc.bias.alibi import ALiBi
from posenc.bias.t5 import T5RelativeBias
from posenc.rotary import FoPE, RotaryEmbedding

Tables = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


@pytest.fixture(autouse=True)
def _float64_default():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def rope_tables(base: float = 10000.0) -> Tables:
    """``cos, sin [n, d/2]`` of integer positions ``p [n]``: angle ``p * base^(-2i/d)``."""

    def tables(p: torch.Tensor, d: int) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # [d/2]
        angles = p.double()[:, None] * inv_freq  # [n, d/2]
        return angles.cos(), angles.sin()

    return tables


def rotate_half_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """One vector ``x [d]``, pairs ``(x[i], x[i + d/2])``: ``[a c - b s | b c + a s]``."""
    n = x.shape[-1] // 2
    a, b = x[:n], x[n:]
    return torch.cat((a * cos - b * sin, b * cos + a * sin))


def naive_layer(
    attn: Attention,
    x: torch.Tensor,
    memory: torch.Tensor | None = None,
    *,
    positions: torch.Tensor | None = None,
    memory_positions: torch.Tensor | None = None,
    tables: Tables | None = None,
    bias: Callable[[int, int, int], float] | None = None,
) -> torch.Tensor:
    """Attention one query at a time: keys ``cat(memory, x)`` at ``cat(memory_positions,
    positions)``, each query and key rotated by its own absolute position (``tables``), the
    causal mask by index (the queries are the last ``s`` keys), ``bias(h, q_pos, k_pos)``."""
    b, s, _ = x.shape
    kv = x if memory is None else torch.cat((memory, x), dim=1)  # [b, t, dim]
    t, h, hk, d = kv.shape[1], attn.num_heads, attn.num_kv_heads, attn.head_dim
    q = attn.q_proj(x).view(b, s, h, d)
    k, v = attn.k_proj(kv).view(b, t, hk, d), attn.v_proj(kv).view(b, t, hk, d)
    qpos = torch.arange(t - s, t) if positions is None else positions
    kpos = qpos if memory is None else torch.cat((memory_positions, qpos))
    out = torch.zeros(b, s, h, d)
    for bi in range(b):
        for hi in range(h):
            for i in range(s):
                qi = q[bi, i, hi]
                if tables is not None:
                    qi = rotate_half_pairs(qi, *(c[0] for c in tables(qpos[i : i + 1], d)))
                scores = []
                for j in range(t):
                    kj = k[bi, j, hi // (h // hk)]
                    if tables is not None:
                        kj = rotate_half_pairs(kj, *(c[0] for c in tables(kpos[j : j + 1], d)))
                    score = float(qi @ kj) * attn.scale
                    if bias is not None:
                        score += bias(hi, int(qpos[i]), int(kpos[j]))
                    scores.append(score if j <= i + (t - s) else -math.inf)
                p = torch.softmax(torch.tensor(scores), 0)
                out[bi, i, hi] = sum(p[j] * v[bi, j, hi // (h // hk)] for j in range(t))
    return attn.o_proj(out.reshape(b, s, h * d))


# --- a forward-only rotary module with Transformer-XL memory -------------------------------------


class ForwardOnlyRope(nn.Module):
    """A user's rotary module with only ``forward`` (the paper's formula, float64); without
    ``k_positions`` it takes ``arange(t)`` for the keys, as posenc's defaults do."""

    family = "rotary"

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.head_dim, self.tables = head_dim, rope_tables()

    def forward(self, q, k, positions, k_positions=None):
        if k_positions is None:
            k_positions = positions if k.shape[2] == q.shape[2] else torch.arange(k.shape[2])

        def rotate(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
            cos, sin = self.tables(p, self.head_dim)  # [n, d/2]
            n = self.head_dim // 2
            a, b = x[..., :n], x[..., n:]
            return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)

        return rotate(q, positions), rotate(k, k_positions)


class LoggedRope(RotaryEmbedding):
    """A subclass that only overrides ``forward`` (Attention then calls its forward)."""

    def __init__(self, head_dim: int) -> None:
        super().__init__(head_dim)
        self.calls = 0

    def forward(self, q, k, positions=None, k_positions=None):
        self.calls += 1
        return super().forward(q, k, positions, k_positions)


def fope_identity_tables(fope: FoPE) -> Tables:
    """FoPE with identity coefficients: RoPE on its kept frequencies, ``c = s = 1`` elsewhere."""
    kept = fope.inv_freq.double()  # [m]

    def tables(p: torch.Tensor, d: int) -> tuple[torch.Tensor, torch.Tensor]:
        angles = p.double()[:, None] * kept  # [n, m]
        ones = torch.ones(p.shape[0], d // 2 - kept.numel())
        return torch.cat((angles.cos(), ones), -1), torch.cat((angles.sin(), ones), -1)

    return tables


def _forward_only_cases() -> list[tuple[str, nn.Module, Tables]]:
    fope = FoPE(8, 2, max_position_embeddings=64, sep_head=False)
    return [
        ("plain module", ForwardOnlyRope(8), rope_tables()),
        ("RotaryEmbedding subclass", LoggedRope(8), rope_tables()),
        ("FoPE", fope, fope_identity_tables(fope)),
    ]


@pytest.mark.parametrize("case", range(3), ids=[c[0] for c in _forward_only_cases()])
@pytest.mark.parametrize("backend", ["sdpa", "explicit"])
def test_forward_only_rotary_with_memory_rotates_memory_by_its_positions(
    case: int, backend: str
) -> None:
    """A segment at positions 104..106 with its memory at 100..103 (not arange: a module that
    dropped the memory's positions would rotate the memory keys as 0..3)."""
    name, encoding, tables = _forward_only_cases()[case]
    torch.manual_seed(0)
    attn = Attention(16, 2, encoding=encoding, backend=backend)
    x, memory = torch.randn(2, 3, 16), torch.randn(2, 4, 16)
    positions, memory_positions = torch.arange(104, 107), torch.arange(100, 104)
    with torch.no_grad():
        got = attn(x, positions=positions, memory=memory, memory_positions=memory_positions)
        want = naive_layer(
            attn, x, memory, positions=positions, memory_positions=memory_positions, tables=tables
        )
        # Relative: the same segment shifted by 1000, memory included, gives the same output.
        shifted = attn(x, positions=positions + 1000, memory=memory,
                       memory_positions=memory_positions + 1000)  # fmt: skip
    torch.testing.assert_close(got, want)
    if name != "FoPE":  # FoPE's c = s = 1 pairs are not a rotation: not shift-invariant
        torch.testing.assert_close(shifted, got)
    if isinstance(encoding, LoggedRope):
        assert encoding.calls == 2


def test_fope_alone_takes_key_positions() -> None:
    """FoPE.forward with more keys than queries: each by its own positions (cache, memory)."""
    fope = FoPE(8, 1, max_position_embeddings=64)
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 7, 8)
    got_q, got_k = fope(q, k, torch.arange(4, 7), torch.arange(7))
    _, whole_k = fope(torch.randn(1, 2, 7, 8), k)  # the keys alone, s == t
    torch.testing.assert_close(got_k, whole_k)
    q_alone, _ = fope(q, k[:, :, 4:], torch.arange(4, 7))
    torch.testing.assert_close(got_q, q_alone)
    default_q, default_k = fope(q, k)  # default: the queries at the last 3 of 7 keys
    torch.testing.assert_close((default_q, default_k), (got_q, got_k))
    with pytest.raises(ValueError, match=r"k has 7 keys but q has 3 queries: pass k_positions"):
        fope(q, k, torch.arange(4, 7))


# --- the bias memo: one entry per encoding ------------------------------------------------------


def alibi_term(slopes: list[float]) -> Callable[[int, int, int], float]:
    """ALiBi's bias ``-slope_h * (q - k)`` (keys at or before the query; the mask hides the rest)."""
    return lambda h, qp, kp: -slopes[h] * (qp - kp)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize(("backend", "flex"), [("sdpa", True), ("explicit", True), ("flex", False)])
def test_two_bias_encodings_of_one_shape_in_one_forward(backend: str, flex: bool) -> None:
    """Two layers of one forward (one position context), each with an ALiBi of other slopes:
    same heads, same positions, so the same bias shape; each layer must get its own bias."""
    torch.manual_seed(0)
    slopes = ([0.5, 0.25], [2.0, 1.0])
    layers = [
        Attention(16, 2, encoding=ALiBi(2, slopes=sl), backend=backend, compile_flex=flex)
        for sl in slopes
    ]
    x = torch.randn(2, 5, 16)
    ctx = layers[0].context(x)
    with torch.no_grad():
        got = [layer(x, context=ctx) for layer in layers]
        for layer, out, sl in zip(layers, got, slopes, strict=True):
            torch.testing.assert_close(out, naive_layer(layer, x, bias=alibi_term(sl)))


@pytest.mark.parametrize("backend", ["sdpa", "explicit"])
def test_alibi_and_t5_of_one_shape_in_one_forward(backend: str) -> None:
    """ALiBi then T5 (whose naive bias is its table read at the bucket of ``k - q``), sharing a
    context: the T5 layer must not get ALiBi's bias, nor ALiBi T5's."""
    torch.manual_seed(0)
    t5 = T5RelativeBias(2, num_buckets=8, max_distance=16, bidirectional=False)
    nn.init.normal_(t5.relative_attention_bias.weight)
    layers = [Attention(16, 2, encoding=enc, backend=backend) for enc in (ALiBi(2), t5)]
    x = torch.randn(1, 6, 16)
    ctx = layers[0].context(x)
    with torch.no_grad():
        got = [layer(x, context=ctx) for layer in layers]
        alone = [layer(x) for layer in layers]  # each in a context of its own
        torch.testing.assert_close(got[0], naive_layer(layers[0], x, bias=_alibi_default(2)))
        table = t5.relative_attention_bias.weight  # [buckets, h]

        def t5_bias(h: int, qp: int, kp: int) -> float:
            return float(table[_causal_bucket(qp - kp, 8, 16), h])

        torch.testing.assert_close(got[1], naive_layer(layers[1], x, bias=t5_bias))
    torch.testing.assert_close(got, alone)


def _alibi_default(h: int) -> Callable[[int, int, int], float]:
    """The paper's slopes for a power of two heads: ``2^(-8 i / h)``, i = 1..h."""
    return alibi_term([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)])


def _causal_bucket(distance: int, num_buckets: int, max_distance: int) -> int:
    """T5's ``_relative_position_bucket`` for ``q - k = distance >= 0`` (unidirectional): exact
    below ``num_buckets / 2``, log-spaced up to ``max_distance``, the last bucket past it."""
    exact = num_buckets // 2
    if distance < exact:
        return distance
    log = math.log(distance / exact) / math.log(max_distance / exact) * (num_buckets - exact)
    return min(exact + int(log), num_buckets - 1)
