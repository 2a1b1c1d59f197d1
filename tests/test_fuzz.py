"""Generated inputs for every public constructor and forward of the absolute, bias and relative
families, xPos and 2-D axial RoPE, their functional helpers, and ``registry.build`` of every name.

Each case has one of two outcomes, and anything else fails:

* the call works, and the result is right: finite, the promised shape, equal to a float64
  formula written here (or to transformers' own bucket functions) where one exists, and equal
  to the same call made again (and, for schemes of ``j - i``, to the same call at a far offset);
* a ``ValueError`` or ``TypeError`` whose message names one of the call's arguments.

A ZeroDivisionError, an IndexError, a RuntimeError from inside torch, a NaN or a crash is a bug
in the library. Options are drawn from their valid ranges and from nonsense (NaN, infinities,
zero, negatives, huge values, wrong types); positions from small, far (2**31 .. 2**62),
negative, float and badly shaped ones; tensors are small.

Every test counts the cases it ran and checks the count against its budget; the budgets add up
to :data:`TOTAL_BUDGET` (at least 10,000). ``POSENC_FUZZ_SCALE=4`` runs four times as many.
``POSENC_FUZZ_COUNTS=path.json`` appends each test's count to a file.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posenc import Attention, registry
from posenc.absolute import Learned2D, LearnedEncoding, NoPE, SinusoidalEncoding
from posenc.bias import FIRE, KERPLE, ALiBi, Sandwich, T5RelativeBias
from posenc.functional import bias as fb
from posenc.functional.relative import clipped_relative_index, rel_shift
from posenc.functional.sinusoidal import sincos_2d, sinusoidal_inv_freq, sinusoidal_table
from posenc.relative import DeBERTaRelative, ShawRelative, TransformerXLRelative
from posenc.rotary import Axial2DRoPE, XPos

SCALE = float(os.environ.get("POSENC_FUZZ_SCALE", "1"))
# Cases per test (per parametrized name); TOTAL_BUDGET below adds them up.
BUDGETS = {
    "bias": 500,
    "relative": 600,
    "absolute": 250,
    "rotary": 400,
    "functional": 160,
    "registry": 150,
}
COUNTS: dict[str, int] = {}
OUTCOMES = {"answered": 0, "refused": 0}  # calls of the test running now, by outcome
F64 = torch.float64


# --- the two outcomes ----------------------------------------------------------------------------


def outcome(call: Callable[[], Any], names: set[str]) -> Any:
    """``call()``'s result, or None when it raised a ValueError/TypeError naming one of ``names``
    (any other exception, or one that names none of them, fails the case)."""
    try:
        result = call()
    except (ValueError, TypeError) as e:
        message = str(e)
        named = any(re.search(rf"(?<![\w.]){re.escape(n)}(?!\w)", message) for n in names)
        assert named, f"{type(e).__name__} names none of {sorted(names)}: {e}"
        OUTCOMES["refused"] += 1
        return None
    OUTCOMES["answered"] += 1
    return result


def fuzz(budget: int, **strategies: st.SearchStrategy) -> Callable[..., Callable[[], None]]:
    """``@given(**strategies)`` for ``budget * SCALE`` cases; the test counts them and checks."""
    n = max(1, int(budget * SCALE))

    def wrap(body: Callable[..., None]) -> Callable[[], None]:
        key = body.__name__

        @functools.wraps(body)
        def counted(**kwargs: Any) -> None:
            COUNTS[key] = COUNTS.get(key, 0) + 1
            body(**kwargs)

        inner = settings(
            max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )(given(**strategies)(counted))

        def run() -> None:
            COUNTS[key] = 0
            OUTCOMES.update(answered=0, refused=0)
            inner()
            _record(key, COUNTS[key])
            assert COUNTS[key] >= n, f"{key}: {COUNTS[key]} cases run, budget {n}"

        return run

    return wrap


def _record(key: str, count: int) -> None:
    print(f"fuzz {key}: {count} cases, calls {OUTCOMES}")
    path = os.environ.get("POSENC_FUZZ_COUNTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": key, "cases": count, **OUTCOMES}) + "\n")


def close(got: torch.Tensor, want: torch.Tensor, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    """float32 result against a float64 formula: tolerance relative to the largest value."""
    got, want = got.detach(), want.detach()
    assert got.shape == want.shape, (got.shape, want.shape)
    assert torch.isfinite(got).all(), "non-finite output"
    scale = 1.0 + float(want.abs().max()) if want.numel() else 1.0
    err = float((got.double() - want).abs().max()) if want.numel() else 0.0
    assert err <= atol * scale + rtol * scale, f"max error {err} (scale {scale})"


# --- strategies ----------------------------------------------------------------------------------

NONSENSE_FLOATS = [math.nan, math.inf, -math.inf, 0.0, -0.0, -1.0, 1e-300, 1e300, -1e300]
JUNK = st.sampled_from(["1", None, [1.0], b"x", 1j, object()])


@dataclass(frozen=True)
class Opt:
    """An option's valid values and, if it can be spoiled, its nonsense ones."""

    valid: st.SearchStrategy
    junk: st.SearchStrategy | None = None


FLOAT_JUNK = st.one_of(st.sampled_from(NONSENSE_FLOATS), st.floats(), JUNK, st.booleans())


def number(valid: st.SearchStrategy) -> Opt:
    """A float option: nonsense is NaN, infinities, zero, negatives, any float, a wrong type."""
    return Opt(valid, FLOAT_JUNK)


def integer(valid: st.SearchStrategy, huge: bool = True) -> Opt:
    """An integer option: nonsense is a bad integer, a float or a wrong type. ``huge``: also
    sizes past any sane limit (for options that size a table, which the library must refuse;
    model widths like ``dim`` are the caller's to choose, and a huge one is a huge model)."""
    values = [0, -1, -(2**40), 2.0, 2.5, math.nan]
    if huge:
        values += [2**16 + 1, 2**31, 2**40, 2**63]
    return Opt(valid, st.one_of(st.sampled_from(values), JUNK, st.booleans()))


def choice(valid: list[str]) -> Opt:
    return Opt(st.sampled_from(valid), st.one_of(st.sampled_from(["", "X", "LOG"]), JUNK))


def spoiled(opt: Opt) -> st.SearchStrategy:
    """One argument: valid two times in three, else nonsense."""
    assert opt.junk is not None
    return st.one_of(opt.valid, opt.valid, opt.junk)


@st.composite
def options(draw: st.DrawFn, specs: dict[str, Opt]) -> dict[str, Any]:
    """Keyword options, valid but for at most one spoiled option (about half the cases)."""
    spoilable = [k for k, o in specs.items() if o.junk is not None]
    spoil = draw(st.sampled_from([None] * max(1, len(spoilable)) + spoilable))
    return {
        k: draw(o.junk if k == spoil and o.junk is not None else o.valid) for k, o in specs.items()
    }


OFFSETS = st.sampled_from([0, 0, 0, 5, 1000, 2**31, 2**40, 2**62])


@st.composite
def positions(draw: st.DrawFn, n: int, batch: int = 2, junk: bool = True) -> Any:
    """Integer positions ``[n]`` or ``[b, n]`` (sorted or not, far or near); with ``junk``,
    sometimes negative, float, the wrong length or not a tensor."""
    kind = draw(st.sampled_from(["1d"] * 8 + ["2d"] * 4 + (["junk"] if junk else [])))
    offset = draw(OFFSETS)
    if kind == "junk":
        return draw(
            st.sampled_from(
                [
                    torch.arange(n) - 3,
                    torch.arange(n).float(),
                    torch.arange(n + 1),
                    torch.zeros(1, 1, n, dtype=torch.long),
                    list(range(n)),
                ]
            )
        )
    rows = batch if kind == "2d" else 1
    vals = draw(st.lists(st.integers(0, 40), min_size=rows * n, max_size=rows * n))
    p = torch.tensor(vals, dtype=torch.long).view(rows, n) + offset
    if draw(st.booleans()):
        p = p.sort(dim=-1).values
    return p[0] if kind == "1d" else p


# --- bias family ---------------------------------------------------------------------------------


def _pairs(qp: torch.Tensor, kp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``(i [B, s, 1], j [B, 1, t], batched)``: query and key positions of every pair, int64."""
    batched = qp.dim() == 2 or kp.dim() == 2
    q = qp if qp.dim() == 2 else qp[None]
    k = kp if kp.dim() == 2 else kp[None]
    return q.long()[:, :, None], k.long()[:, None, :], batched


def max_distance(qp: torch.Tensor, kp: torch.Tensor) -> int:
    """The largest ``|i - j|`` of the call (0 when there are no pairs)."""
    i, j, _ = _pairs(qp, kp)
    return int((j - i).abs().max()) if i.numel() and j.numel() else 0


def bias_reference(enc: torch.nn.Module, qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor:
    """``[(b,) h, s, t]`` float64 from the papers' formulas (transformers' buckets for T5)."""
    from transformers.models.t5.modeling_t5 import T5Attention

    from test_bias_functional import paper_alibi_slopes

    i, j, batched = _pairs(qp, kp)
    rel = (j - i).double()  # [B, s, t]: j - i
    if isinstance(enc, ALiBi):
        m = torch.tensor(paper_alibi_slopes(enc.num_heads), dtype=F64)[:, None, None, None]
        out = m * rel if enc.causal else -m * rel.abs()  # [h, B, s, t]
    elif isinstance(enc, T5RelativeBias):
        bucket = T5Attention._relative_position_bucket(
            j - i, enc.bidirectional, enc.num_buckets, enc.max_distance
        )
        out = enc.relative_attention_bias.weight.double()[bucket].movedim(-1, 0)
    elif isinstance(enc, KERPLE):
        r1 = enc.r1.detach().double().clamp(min=enc.eps)[:, None, None, None]
        r2 = enc.r2.detach().double().clamp(min=enc.eps, max=enc._r2_max)[:, None, None, None]
        if enc.variant == "log":
            out = -r1 * torch.log1p(r2 * rel.abs())
        else:
            out = (-r1 * rel.abs() ** r2).clamp(min=torch.finfo(torch.float32).min)
    elif isinstance(enc, FIRE):
        out = _fire_reference(enc, i.double(), (i - j).double())
    else:
        out = _sandwich_reference(enc, rel)
    out = out.movedim(0, 1)  # [B, h, s, t]
    return out if batched else out[0]


def _fire_reference(enc: FIRE, i: torch.Tensor, dist: torch.Tensor) -> torch.Tensor:
    c, big_l = float(enc.c), abs(float(enc.L_multiplier) * enc.init_threshold)
    x = torch.log((c * dist).abs() + 1) / (
        torch.log((c * torch.clamp(i, min=big_l)).abs() + 1) + enc.eps
    )  # [B, s, t]
    w1, b1 = enc.mlp[0].weight.detach().double()[:, 0], enc.mlp[0].bias.detach().double()
    w2, b2 = enc.mlp[2].weight.detach().double(), enc.mlp[2].bias.detach().double()
    hidden = torch.relu(x[..., None] * w1 + b1)  # [B, s, t, w]
    return (hidden @ w2.t() + b2).movedim(-1, 0)  # [h, B, s, t]


def _sandwich_reference(enc: Sandwich, rel: torch.Tensor) -> torch.Tensor:
    half = enc.d_prime // 2
    freq = enc.base ** (-2.0 * torch.arange(1, half + 1, dtype=F64) / enc.d_prime)
    shared = torch.cos(rel[..., None] * freq).sum(-1) - half  # [B, s, t]
    ratio = 8.0 * torch.arange(1, enc.num_heads + 1, dtype=F64) / enc.num_heads
    return shared[None] / ratio[:, None, None, None]  # [h, B, s, t]


def _score_mod_bias(enc: Any, qp: torch.Tensor, kp: torch.Tensor, layout: bool) -> torch.Tensor:
    from test_bias_edges import score_mod_bias

    out = score_mod_bias(enc, qp, kp, index_layout=layout)  # [B, h, s, t]
    return out if (qp.dim() == 2 or kp.dim() == 2) else out[0]


HEADS = integer(st.integers(1, 5))
BIAS_OPTIONS: dict[str, dict[str, Opt]] = {
    "alibi": {"num_heads": HEADS, "causal": Opt(st.booleans())},
    "t5": {
        "num_heads": HEADS,
        "num_buckets": integer(st.integers(2, 64)),
        "max_distance": integer(st.integers(1, 300)),
        "bidirectional": Opt(st.booleans()),
    },
    "kerple": {
        "num_heads": HEADS,
        "variant": choice(["log", "power"]),
        "eps": number(st.floats(1e-4, 1.0)),
    },
    "fire": {
        "num_heads": HEADS,
        "mlp_width": integer(st.integers(1, 16)),
        "init_c": number(st.floats(-2.0, 2.0)),
        "init_threshold": number(st.floats(1e-3, 1e4)),
        "eps": number(st.floats(1e-9, 1.0)),
    },
    "sandwich": {
        "num_heads": HEADS,
        "d_prime": Opt(
            st.integers(1, 16).map(lambda n: 2 * n),
            st.sampled_from([0, -2, 7, 4097, 2**40, 8.0, "8", None]),
        ),
        "base": number(st.floats(1.0001, 1e6)),
        "cache_len": integer(st.integers(1, 64)),
    },
}
BIAS_CLASSES = {"alibi": ALiBi, "t5": T5RelativeBias, "kerple": KERPLE, "fire": FIRE}
BIAS_CLASSES["sandwich"] = Sandwich
SHIFT_INVARIANT = ("alibi", "t5", "kerple", "sandwich")


def _perturb(enc: torch.nn.Module, seed: int, std: float = 2.0) -> None:
    """Learned parameters anywhere (KERPLE's out of their ranges too), as training leaves them."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in enc.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * std)


@pytest.mark.parametrize("name", list(BIAS_OPTIONS))
def test_bias_modules(name: str) -> None:
    @fuzz(
        BUDGETS["bias"],
        options=options(BIAS_OPTIONS[name]),
        s=st.integers(0, 6),
        t=st.integers(0, 6),
        data=st.data(),
        seed=st.integers(0, 2**16),
    )
    def bias_case(options: dict, s: int, t: int, data: Any, seed: int) -> None:
        enc = outcome(lambda: BIAS_CLASSES[name](**options), set(options))
        if enc is None:
            return
        _perturb(enc, seed)
        qp, kp = data.draw(positions(s)), data.draw(positions(t))
        got = outcome(lambda: enc.bias(qp, kp), {"positions", "k_positions"})
        if got is None:
            return
        assert got.dtype == torch.float32
        if name != "sandwich" or max_distance(qp, kp) <= 2**30:
            # Beyond that an angle r f has no float64 digits left, in the formula as here.
            close(got, bias_reference(enc, qp, kp), rtol=1e-5, atol=1e-5)
        else:
            assert torch.isfinite(got).all()
        assert torch.equal(enc.bias(qp, kp), got)
        close(_score_mod_bias(enc, qp, kp, False), got.double(), rtol=1e-5, atol=1e-5)
        _check_shift(name, enc, qp, kp, got)

    bias_case()


def _check_shift(
    name: str, enc: Any, qp: torch.Tensor, kp: torch.Tensor, got: torch.Tensor
) -> None:
    """A scheme of ``j - i`` gives the same numbers 2**40 positions further."""
    top = max([int(p.max()) for p in (qp, kp) if p.numel()] or [0])
    if name in SHIFT_INVARIANT and top < 2**62:
        assert torch.equal(enc.bias(qp + 2**40, kp + 2**40), got)
    if name == "sandwich" and qp.dim() == kp.dim() == 1 and qp.numel() <= kp.numel():
        # The index layout's table path: keys c .. c + t - 1, queries their last s.
        t, s = kp.numel(), qp.numel()
        k = torch.arange(t) + (int(kp[0]) if t else 0)
        close(_score_mod_bias(enc, k[t - s :], k, True), enc.bias(k[t - s :], k).double())


# --- relative family -----------------------------------------------------------------------------


def _expand(x: torch.Tensor, b: int) -> torch.Tensor:
    """``[B, ...]`` with ``B`` 1 or ``b`` -> ``[b, ...]``."""
    return x.expand(b, *x.shape[1:])


def _finish(scores: torch.Tensor, mask: torch.Tensor | None, v: torch.Tensor) -> torch.Tensor:
    """The attention probabilities: softmax over the keys that ``mask`` keeps, float64."""
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    return torch.softmax(scores, dim=-1)


def shaw_reference(enc: ShawRelative, q, k, v, qp, kp, mask, scale) -> torch.Tensor:
    """Shaw et al.'s equations (5) and (3), float64."""
    i, j, _ = _pairs(qp, kp)
    b = q.shape[0]
    rel = _expand((j - i).clamp(-enc.max_distance, enc.max_distance) + enc.max_distance, b)
    a_k = enc.rel_k.detach().double()[rel]  # [b, s, t, d]
    scores = (q @ k.transpose(-1, -2) + torch.einsum("bhsd,bstd->bhst", q, a_k)) * scale
    probs = _finish(scores, mask, v)
    out = probs @ v
    if enc.rel_v is not None:
        out = out + torch.einsum("bhst,bstd->bhsd", probs, enc.rel_v.detach().double()[rel])
    return out


def txl_reference(enc: TransformerXLRelative, q, k, v, qp, kp, mask, scale) -> torch.Tensor:
    """Transformer-XL's ``A = (q + u) k + (q + v) W_R R_{i-j}``, R from the formula, float64."""
    i, j, _ = _pairs(qp, kp)
    b, h, _, d = q.shape
    dist = _expand((i - j).double(), b)  # [b, s, t]
    freq = enc.base ** (-torch.arange(0, enc.dim, 2, dtype=F64) / enc.dim)  # [dim/2]
    ang = dist[..., None] * freq
    r = torch.cat((ang.sin(), ang.cos()), dim=-1)  # [b, s, t, dim]
    w_r = (r @ enc.r_net.weight.detach().double().t()).unflatten(-1, (h, d))  # [b, s, t, h, d]
    u, vb = enc.r_w_bias.detach().double(), enc.r_r_bias.detach().double()
    content = (q + u[:, None]) @ k.transpose(-1, -2)
    position = torch.einsum("bhsd,bsthd->bhst", q + vb[:, None], w_r)
    return _finish((content + position) * scale, mask, v) @ v


def deberta_reference(enc: DeBERTaRelative, q, k, v, qp, kp, mask, scale) -> torch.Tensor:
    """DeBERTa's disentangled scores with transformers' log buckets, float64 (own projections)."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    i, j, _ = _pairs(qp, kp)
    b, h, _, d = q.shape
    rel = _expand(i - j, b)  # [b, s, t]: query - key
    if enc.position_buckets > 0:
        rel = make_log_bucket_position(rel, enc.position_buckets, enc.max_relative_positions)
    idx = (rel.clamp(-enc.span, enc.span - 1) + enc.span).long()  # clamped before shifting
    p = enc.rel_embeddings.weight.detach().double()
    if enc.norm is not None:
        p = torch.nn.functional.layer_norm(
            p, p.shape[-1:], enc.norm.weight.double(), enc.norm.bias.double(), enc.norm.eps
        )
    scores = q @ k.transpose(-1, -2)
    for term, proj, x in (("c2p", enc.pos_key_proj, q), ("p2c", enc.pos_query_proj, k)):
        if term in enc.pos_att_type:
            table = torch.nn.functional.linear(p, proj.weight.double(), proj.bias.double())
            table = table.view(-1, h, d)[idx]  # [b, s, t, h, d]
            sub = "bhsd,bsthd->bhst" if term == "c2p" else "bhtd,bsthd->bhst"
            scores = scores + torch.einsum(sub, x, table)
    return _finish(scores * scale / math.sqrt(enc.scale_factor), mask, v) @ v


RELATIVE = {
    "shaw": (
        lambda dim, heads, **o: ShawRelative(dim // heads, **o),
        {
            "max_distance": integer(st.integers(1, 8)),
            "values": Opt(st.booleans()),
            "init_std": number(st.floats(0.0, 1.0)),
        },
        shaw_reference,
    ),
    "transformer-xl": (
        lambda dim, heads, **o: TransformerXLRelative(dim, heads, **o),
        {"base": number(st.floats(1.5, 1e5)), "init_std": number(st.floats(0.0, 1.0))},
        txl_reference,
    ),
    "deberta": (
        lambda dim, heads, **o: DeBERTaRelative(dim, heads, share_att_key=False, **o),
        {
            "position_buckets": integer(st.integers(-1, 12)),
            "max_relative_positions": integer(st.integers(1, 40)),
            "pos_att_type": Opt(
                st.sampled_from(["c2p|p2c", "c2p", "p2c", "", ("c2p",), "p2c|c2p"]),
                st.sampled_from(["x", 3, ("c2p", "q2q"), None]),
            ),
            "norm_rel_ebd": Opt(st.booleans()),
            "layer_norm_eps": number(st.floats(1e-9, 1e-3)),
        },
        deberta_reference,
    ),
}
ATTEND_NAMES = {"q", "k", "v", "positions", "k_positions", "mask", "head_dim", "heads"}


def _qkv(shape: tuple[int, ...], bad: str | None, seed: int) -> tuple[torch.Tensor, ...]:
    """q ``[b, h, s, 4]``, k and v ``[b, hk, t, 4]``, spoiled one way when ``bad`` says so."""
    b, h, hk, s, t = shape
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, s, 4, generator=gen)
    k, v = torch.randn(2, b, hk, t, 4, generator=gen)
    if bad == "dtype":
        k = k.double()
    elif bad == "head_dim":
        q = q[..., :3]
    elif bad == "batch":
        k, v = k[:1].expand(b + 1, -1, -1, -1), v[:1].expand(b + 1, -1, -1, -1)
    elif bad == "int":
        q = q.long()
    return q, k, v


ATTEND_SHAPES = st.tuples(
    st.integers(1, 2), st.sampled_from([(1, 1), (2, 1), (2, 2), (4, 2), (3, 2)]), st.integers(0, 5)
).flatmap(
    lambda x: st.tuples(
        st.just(x[0]),
        st.just(x[1][0]),
        st.just(x[1][1]),
        st.just(x[2]),
        st.integers(x[2] if x[2] else 0, 7),
    )
)


@pytest.mark.parametrize("name", list(RELATIVE))
def test_relative_modules(name: str) -> None:
    make, specs, reference = RELATIVE[name]

    @fuzz(
        BUDGETS["relative"],
        options=options(specs),
        shape=ATTEND_SHAPES,
        explicit=st.booleans(),
        masked=st.booleans(),
        bad=st.sampled_from([None] * 16 + ["dtype", "head_dim", "batch", "int"]),
        data=st.data(),
        seed=st.integers(0, 2**16),
    )
    def relative_case(options, shape, explicit, masked, bad, data, seed) -> None:
        b, h, _, s, t = shape
        names = {"dim", "num_heads", "head_dim", *options}
        enc = outcome(lambda: make(4 * h, h, **options), names)
        if enc is None:
            return
        _perturb(enc, seed, std=0.5)
        q, k, v = _qkv(shape, bad, seed)
        qp = data.draw(positions(s, b)) if explicit else None
        kp = data.draw(positions(t, b)) if explicit else None
        mask = None
        if masked:  # causal by index: every row keeps a key whenever there is one
            mask = torch.arange(t)[None, :] <= torch.arange(s)[:, None] + (t - s)
        kw = {"positions": qp, "k_positions": kp, "mask": mask}
        out = outcome(lambda: enc.attend(q, k, v, **kw), ATTEND_NAMES)
        if out is None:
            return
        assert out.shape == q.shape and torch.isfinite(out).all()
        assert torch.equal(enc.attend(q, k, v, **kw), out)
        _check_relative(enc, reference, (q, k, v), qp, kp, mask, out)

    relative_case()


def _check_relative(enc, reference, qkv, qp, kp, mask, out) -> None:
    """Against the float64 reference (default positions: keys 0..t-1, queries the last s), and
    the same call 2**40 positions further gives the same output."""
    q, k, v = qkv
    s, t = q.shape[2], k.shape[2]
    qp_ = torch.arange(t - s, t) if qp is None else qp
    kp_ = torch.arange(t) if kp is None else kp
    rep = q.shape[1] // k.shape[1]
    k64, v64 = (x.double().repeat_interleave(rep, dim=1) for x in (k, v))
    if max_distance(qp_, kp_) <= 2**30:
        want = reference(enc, q.double(), k64, v64, qp_, kp_, mask, 1 / math.sqrt(q.shape[-1]))
        close(out, want, rtol=1e-4, atol=1e-4)
    top = max([int(p.max()) for p in (qp_, kp_) if p.numel()] or [0])
    if top < 2**62:
        far = enc.attend(q, k, v, positions=qp_ + 2**40, k_positions=kp_ + 2**40, mask=mask)
        close(far, out.double(), rtol=1e-5, atol=1e-5)


# --- absolute family -----------------------------------------------------------------------------


def sinusoid_reference(p: torch.Tensor, dim: int, base: float, layout: str) -> torch.Tensor:
    """The sinusoidal tables from the papers' formulas, float64: ``[*] -> [*, dim]``."""
    half = dim // 2
    i = torch.arange(half, dtype=F64)
    f = base ** (-i / (half - 1)) if layout == "fairseq" else base ** (-2 * i / dim)
    ang = p.double()[..., None] * f
    if layout == "interleaved":
        return torch.stack((ang.sin(), ang.cos()), dim=-1).flatten(-2)
    out = torch.cat((ang.sin(), ang.cos()), dim=-1)
    return torch.nn.functional.pad(out, (0, dim % 2))


ABSOLUTE: dict[str, dict[str, Opt]] = {
    "sinusoidal": {
        "dim": integer(st.integers(1, 12), huge=False),
        "base": number(st.floats(1.01, 1e5)),
        "layout": choice(["interleaved", "concat", "fairseq"]),
        "scale_input": Opt(st.booleans()),
        "cache_len": integer(st.integers(0, 64)),
    },
    "learned": {
        "max_positions": integer(st.integers(1, 64)),
        "dim": integer(st.integers(1, 12), huge=False),
        "init_std": number(st.floats(0.0, 1.0)),
    },
    "learned-2d": {
        "grid_h": integer(st.integers(1, 4)),
        "grid_w": integer(st.integers(1, 4)),
        "dim": integer(st.integers(1, 12), huge=False),
        "num_prefix_tokens": integer(st.integers(0, 2)),
        "init_std": number(st.floats(0.0, 1.0)),
    },
    "none": {},
}
ABSOLUTE_CLASSES = {"sinusoidal": SinusoidalEncoding, "learned": LearnedEncoding}
ABSOLUTE_CLASSES.update({"learned-2d": Learned2D, "none": NoPE})


@pytest.mark.parametrize("name", list(ABSOLUTE))
def test_absolute_modules(name: str) -> None:
    @fuzz(
        BUDGETS["absolute"],
        options=options(ABSOLUTE[name]),
        shape=st.tuples(st.integers(1, 2), st.integers(0, 6), st.sampled_from([0] * 6 + [-1, 1])),
        explicit=st.booleans(),
        data=st.data(),
        seed=st.integers(0, 2**16),
    )
    def absolute_case(options, shape, explicit, data, seed) -> None:
        enc = outcome(lambda: ABSOLUTE_CLASSES[name](**options), set(options))
        if enc is None:
            return
        b, s, wrong_dim = shape
        dim = getattr(enc, "dim", 4) + wrong_dim
        if isinstance(enc, Learned2D):
            s = enc.weight.shape[0] + wrong_dim
        x = torch.randn(b, s, max(dim, 1), generator=torch.Generator().manual_seed(seed))
        p = data.draw(positions(s, b)) if explicit and name in ("sinusoidal", "learned") else None
        args = (x,) if isinstance(enc, Learned2D) else (x, p)
        out = outcome(lambda: enc(*args), {"x", "positions"})
        if out is None:
            return
        assert out.shape == x.shape and torch.isfinite(out).all()
        assert torch.equal(enc(*args), out)
        close(out, _absolute_reference(enc, x, p))

    absolute_case()


def _absolute_reference(enc: torch.nn.Module, x: torch.Tensor, p: torch.Tensor | None):
    x64, s = x.double(), x.shape[1]
    p = torch.arange(s) if p is None else p
    if isinstance(enc, SinusoidalEncoding):
        if p.numel() and int(p.max()) > 2**30:  # no float64 digits left in such angles
            return enc(x, p).double()
        scale = math.sqrt(enc.dim) if enc.scale_input else 1.0
        return x64 * scale + sinusoid_reference(p, enc.dim, enc.base, enc.layout)
    if isinstance(enc, LearnedEncoding):
        return x64 + enc.weight.detach().double()[p]
    if isinstance(enc, Learned2D):
        return x64 + enc.weight.detach().double()
    return x64


# --- rotary: xPos and 2-D axial ------------------------------------------------------------------


def xpos_reference(x: torch.Tensor, p: torch.Tensor, enc: XPos, down: bool) -> torch.Tensor:
    """xPos from the paper, float64: rotate pair i by ``p theta_i``, scale by
    ``zeta_i ** (+-(p - center) / scale_base)``. Shapes: ``x [b, h, n, d]``, ``p [n]|[b, n]``."""
    d = x.shape[-1]
    i = torch.arange(d // 2, dtype=F64)
    theta = enc.base ** (-2 * i / d)
    zeta = (2 * i / d + enc.gamma) / (1 + enc.gamma)
    pp = (p if p.dim() == 2 else p[None])[:, None, :, None]  # [B, 1, n, 1]
    ang = pp.double() * theta
    scale = zeta ** ((pp - enc.center).double() / enc.scale_base * (-1 if down else 1))
    if enc.layout == "interleaved":
        a, c = x[..., 0::2], x[..., 1::2]
    else:
        a, c = x[..., : d // 2], x[..., d // 2 :]
    ra, rc = (a * ang.cos() - c * ang.sin()) * scale, (c * ang.cos() + a * ang.sin()) * scale
    if enc.layout == "interleaved":
        return torch.stack((ra, rc), dim=-1).flatten(-2)
    return torch.cat((ra, rc), dim=-1)


ROTARY: dict[str, dict[str, Opt]] = {
    "xpos": {
        "head_dim": integer(st.sampled_from([2, 4, 8]), huge=False),
        "base": number(st.floats(1.5, 1e5)),
        "scale_base": number(st.floats(1.0, 2048.0)),
        "gamma": number(st.floats(0.05, 4.0)),
        "layout": choice(["interleaved", "half"]),
        "center": integer(st.sampled_from([0, 3, 40, 2**31, 2**40])),
        "backend": choice(["auto", "torch", "cpu"]),
    },
    "axial": {
        "head_dim": integer(st.sampled_from([4, 8]), huge=False),
        "grid_size": Opt(
            st.tuples(st.integers(1, 3), st.integers(1, 3)),
            st.sampled_from([(0, 2), (2,), 3, "2x2", (2, 2.5), None]),
        ),
        "base": number(st.floats(1.5, 1e5)),
        "num_prefix_tokens": integer(st.integers(0, 2)),
        "layout": choice(["half", "interleaved"]),
        "frequencies": choice(["axis", "alternate"]),
        "arrangement": choice(["merged", "blocks"]),
        "backend": choice(["auto", "torch", "cpu"]),
    },
}
QK_NAMES = {"q", "k", "positions", "k_positions", "coords", "k_coords", "grid_size", "backend"}


@pytest.mark.parametrize("name", list(ROTARY))
def test_rotary_modules(name: str) -> None:
    @fuzz(
        BUDGETS["rotary"],
        options=options(ROTARY[name]),
        shape=st.tuples(st.integers(1, 2), st.sampled_from([(1, 1), (2, 1), (2, 2)])),
        explicit=st.booleans(),
        dtype=st.sampled_from([torch.float32] * 6 + [torch.float64, torch.bfloat16]),
        data=st.data(),
    )
    def rotary_case(options, shape, explicit, dtype, data) -> None:
        cls = XPos if name == "xpos" else Axial2DRoPE
        enc = outcome(lambda: cls(**options), set(options))
        if enc is None:
            return
        (b, (h, hk)), d = shape, enc.head_dim
        s = data.draw(st.integers(0, 6))
        t = s if not explicit else data.draw(st.integers(0, 6))
        q, k = torch.randn(b, h, s, d, dtype=dtype), torch.randn(b, hk, t, d, dtype=dtype)
        qp = _near(enc, data.draw(positions(s, b))) if explicit else None
        kp = _near(enc, data.draw(positions(t, b))) if explicit else None
        got = outcome(lambda: enc(q, k, qp, kp), QK_NAMES)
        if got is None:
            return
        (rq, rk), n = got, 2 * (h * s + hk * t)
        assert rq.shape == q.shape and rk.shape == k.shape and rq.dtype == dtype
        assert torch.isfinite(rq).all() and torch.isfinite(rk).all(), n
        again = enc(q, k, qp, kp)
        assert torch.equal(again[0], rq) and torch.equal(again[1], rk)
        _check_rotary(enc, (q, k), (rq, rk), qp, kp)

    rotary_case()


def _near(enc: torch.nn.Module, p: Any) -> Any:
    """Positions around xPos' center (else they are only out of its range)."""
    center = getattr(enc, "center", 0)
    if not isinstance(p, torch.Tensor) or p.is_floating_point() or center == 0:
        return p
    return p - int(p.min()) + center if p.numel() else p


def _check_rotary(enc, qk, rotated, qp, kp) -> None:
    """xPos against its float64 formula; axial RoPE keeps every token's norm (a rotation) and
    leaves its prefix tokens alone."""
    (q, k), (rq, rk) = qk, rotated
    tol = (
        {"rtol": 1e-5, "atol": 1e-5} if q.dtype != torch.bfloat16 else {"rtol": 2e-2, "atol": 2e-2}
    )
    if isinstance(enc, XPos):
        qp = torch.arange(q.shape[2]) if qp is None else qp
        kp = torch.arange(k.shape[2]) if kp is None else kp
        if max([int(p.max()) for p in (qp, kp) if p.numel()] or [0]) <= 2**30:
            close(rq, xpos_reference(q.double(), qp, enc, False), **tol)
            close(rk, xpos_reference(k.double(), kp, enc, True), **tol)
        return
    for x, r in ((q, rq), (k, rk)):
        close(r.double().norm(dim=-1), x.double().norm(dim=-1), **tol)


# --- functional helpers --------------------------------------------------------------------------


def _int_tensor(draw: st.DrawFn, low: int = -(2**62), high: int = 2**62) -> Any:
    """A small integer tensor (any values in range), or sometimes a float tensor or a list."""
    near = st.integers(max(low, -50), min(high, 50))
    vals = draw(st.lists(st.integers(low, high) | near, min_size=0, max_size=12))
    junk = draw(st.sampled_from([None] * 12 + ["float", "list"]))
    if junk == "float":
        return torch.tensor(vals, dtype=torch.float32)
    return vals if junk == "list" else torch.tensor(vals, dtype=torch.long)


def _f_t5(draw: st.DrawFn) -> tuple[Callable[[], Any], set[str], Callable[[Any], None]]:
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = _int_tensor(draw)
    kw = draw(
        options(
            {
                "bidirectional": Opt(st.booleans()),
                "num_buckets": integer(st.integers(2, 64)),
                "max_distance": integer(st.integers(1, 300)),
            }
        )
    )

    def check(out: torch.Tensor) -> None:
        assert torch.equal(out, T5Attention._relative_position_bucket(rel, **kw))

    return (lambda: fb.t5_relative_bucket(rel, **kw)), {"relative_position", *kw}, check


def _f_deberta(draw: st.DrawFn) -> tuple[Callable[[], Any], set[str], Callable[[Any], None]]:
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    rel = _int_tensor(draw, -(2**40), 2**40)
    kw = draw(
        options(
            {
                "bucket_size": integer(st.integers(2, 64)),
                "max_position": integer(st.integers(1, 600)),
            }
        )
    )

    def check(out: torch.Tensor) -> None:
        want = make_log_bucket_position(rel, kw["bucket_size"], kw["max_position"])
        assert torch.equal(out, want.long())

    return (lambda: fb.deberta_log_bucket(rel, **kw)), {"relative_position", *kw}, check


def _f_alibi(draw: st.DrawFn) -> tuple[Callable[[], Any], set[str], Callable[[Any], None]]:
    from test_bias_functional import paper_alibi_slopes

    n = draw(spoiled(integer(st.integers(1, 3000))))

    def check(out: torch.Tensor) -> None:
        close(out, torch.tensor(paper_alibi_slopes(n), dtype=F64), rtol=1e-6, atol=0)

    return (lambda: fb.alibi_slopes(n)), {"num_heads"}, check


def _f_kerple(draw: st.DrawFn) -> tuple[Callable[[], Any], set[str], Callable[[Any], None]]:
    d = _int_tensor(draw)
    h = draw(st.integers(1, 4))
    r1 = torch.tensor(draw(st.lists(st.floats(0.01, 5.0), min_size=h, max_size=h)))
    r2 = torch.tensor(draw(st.lists(st.floats(0.01, 2.0), min_size=h, max_size=h)))
    log = draw(st.booleans())
    fn = fb.kerple_log_bias if log else fb.kerple_power_bias

    def check(out: torch.Tensor) -> None:
        dd = d.double().abs()[None]
        a, b = r1.double().view(-1, *[1] * d.dim()), r2.double().view(-1, *[1] * d.dim())
        want = -a * torch.log1p(b * dd) if log else (-a * dd**b).clamp(min=-3.4028234663852886e38)
        close(out, want, rtol=1e-5, atol=0)

    return (lambda: fn(d, r1, r2)), {"distance"}, check


def _f_sinusoidal(draw: st.DrawFn) -> tuple[Callable[[], Any], set[str], Callable[[Any], None]]:
    p = _int_tensor(draw, 0, 2**30)
    kw = draw(
        options(
            {
                "dim": integer(st.integers(1, 12), huge=False),
                "base": number(st.floats(1.01, 1e5)),
                "layout": choice(["interleaved", "concat", "fairseq"]),
            }
        )
    )

    def check(out: torch.Tensor) -> None:
        close(out, sinusoid_reference(p, kw["dim"], kw["base"], kw["layout"]))

    return (lambda: sinusoidal_table(p, **kw)), {"positions", *kw}, check


def _f_sandwich(draw: st.DrawFn) -> tuple[Callable[[], Any], set[str], Callable[[Any], None]]:
    m = draw(spoiled(Opt(st.integers(0, 40), st.sampled_from([-1, 2.0, None, "3"]))))
    kw = draw(
        options(
            {
                "d_prime": integer(st.integers(1, 8).map(lambda n: 2 * n)),
                "base": number(st.floats(1.01, 1e5)),
            }
        )
    )

    def check(out: torch.Tensor) -> None:
        half = kw["d_prime"] // 2
        f = kw["base"] ** (-2.0 * torch.arange(1, half + 1, dtype=F64) / kw["d_prime"])
        want = torch.cos(torch.arange(m + 1, dtype=F64)[:, None] * f).sum(-1) - half
        close(out, want, rtol=1e-12, atol=1e-12)

    return (lambda: fb.sandwich_distance_table(m, **kw)), {"max_distance", *kw}, check


def _f_rel_shift(draw: st.DrawFn) -> tuple[Callable[[], Any], set[str], Callable[[Any], None]]:
    s_, t = draw(st.integers(0, 5)), draw(st.integers(0, 5))
    exact = draw(st.booleans())
    length = s_ + t - 1 if exact and s_ + t else draw(st.integers(0, 9))
    key_len = draw(spoiled(Opt(st.just(t), st.sampled_from([-1, length + 1, 2.0, None]))))
    x = torch.randn(2, s_, max(length, 0))

    def check(out: torch.Tensor) -> None:
        assert out.shape == (2, s_, key_len)
        if length == s_ + t - 1 and key_len == t:  # every distance present: exact
            for i in range(s_):
                for j in range(t):
                    assert torch.equal(out[:, i, j], x[:, i, j + s_ - 1 - i])

    return (lambda: rel_shift(x, key_len)), {"x", "key_len"}, check


def _f_pairs(draw: st.DrawFn) -> tuple[Callable[[], Any], set[str], Callable[[Any], None]]:
    """relative_position_matrix and clipped_relative_index against j - i."""
    qp, kp = draw(positions(draw(st.integers(0, 5)))), draw(positions(draw(st.integers(0, 5))))
    k = draw(st.one_of(st.none(), spoiled(integer(st.integers(1, 9)))))

    def call() -> torch.Tensor:
        if k is None:
            return fb.relative_position_matrix(qp, kp)
        return clipped_relative_index(qp, kp, k)

    def check(out: torch.Tensor) -> None:
        i, j, batched = _pairs(qp, kp)
        want = j - i if k is None else (j - i).clamp(-k, k) + k
        assert torch.equal(out, want if batched else want[0])

    return call, {"positions", "k_positions", "max_distance"}, check


def _f_inv_freq(draw: st.DrawFn) -> tuple[Callable[[], Any], set[str], Callable[[Any], None]]:
    kw = draw(
        options(
            {
                "dim": integer(st.integers(1, 64), huge=False),
                "base": number(st.floats(1.01, 1e6)),
                "layout": choice(["interleaved", "concat", "fairseq"]),
            }
        )
    )

    def check(out: torch.Tensor) -> None:
        half = kw["dim"] // 2
        i = torch.arange(half, dtype=F64)
        want = kw["base"] ** (-i / (half - 1) if kw["layout"] == "fairseq" else -2 * i / kw["dim"])
        close(out, want, rtol=1e-12, atol=0)

    return (lambda: sinusoidal_inv_freq(**kw)), set(kw), check


def _f_sincos_2d(draw: st.DrawFn) -> tuple[Callable[[], Any], set[str], Callable[[Any], None]]:
    kw = draw(
        options(
            {
                "grid_h": integer(st.integers(1, 4)),
                "grid_w": integer(st.integers(1, 4)),
                "dim": integer(st.sampled_from([4, 8, 12, 6]), huge=False),
                "base": number(st.floats(1.01, 1e5)),
                "layout": choice(["mae", "timm"]),
            }
        )
    )

    def check(out: torch.Tensor) -> None:
        rows = torch.arange(kw["grid_h"]).repeat_interleave(kw["grid_w"])
        cols = torch.arange(kw["grid_w"]).repeat(kw["grid_h"])
        half = kw["dim"] // 2
        enc_r, enc_c = (sinusoid_reference(p, half, kw["base"], "concat") for p in (rows, cols))
        if kw["layout"] == "mae":
            close(out, torch.cat((enc_c, enc_r), dim=-1))
        else:
            q = half // 2
            parts = (enc_r[:, :q], enc_c[:, :q], enc_r[:, q:], enc_c[:, q:])
            close(out, torch.cat(parts, dim=-1))

    return (lambda: sincos_2d(**kw)), set(kw), check


def _f_fire(draw: st.DrawFn) -> tuple[Callable[[], Any], set[str], Callable[[Any], None]]:
    n = draw(st.integers(0, 6))
    i = torch.tensor(draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n)), dtype=F64)
    dist = torch.tensor(draw(st.lists(st.integers(-(2**40), 2**40), min_size=n, max_size=n)))
    c, big_l = draw(st.floats(-2.0, 2.0)), draw(st.floats(1e-3, 1e4))
    eps = draw(st.floats(1e-9, 1.0))
    dist = dist.double()

    def call() -> torch.Tensor:
        c_, l_ = torch.tensor(c, dtype=F64), torch.tensor(big_l, dtype=F64)
        return fb.fire_normalized_distance(i, dist, c_, l_, eps)

    def check(out: torch.Tensor) -> None:
        want = torch.log1p((c * dist).abs()) / (torch.log1p((c * i.clamp(min=big_l)).abs()) + eps)
        close(out, want, rtol=1e-12, atol=0)

    return call, {"positions", "distance"}, check


FUNCTIONAL = {
    "t5_relative_bucket": _f_t5,
    "deberta_log_bucket": _f_deberta,
    "alibi_slopes": _f_alibi,
    "kerple": _f_kerple,
    "sinusoidal_table": _f_sinusoidal,
    "sinusoidal_inv_freq": _f_inv_freq,
    "sincos_2d": _f_sincos_2d,
    "sandwich_distance_table": _f_sandwich,
    "fire_normalized_distance": _f_fire,
    "rel_shift": _f_rel_shift,
    "relative_positions": _f_pairs,
}


@pytest.mark.parametrize("name", list(FUNCTIONAL))
def test_functional(name: str) -> None:
    @fuzz(BUDGETS["functional"], data=st.data())
    def functional_case(data) -> None:
        call, names, check = FUNCTIONAL[name](data.draw)
        out = outcome(call, names)
        if out is not None:
            assert torch.isfinite(out.double()).all()
            check(out)
            assert torch.equal(call(), out)

    functional_case()


# --- registry.build of every name ----------------------------------------------------------------

REGISTRY_OPTIONS: dict[str, Opt] = {
    "base": number(st.floats(1.5, 1e5)),
    "layout": choice(["interleaved", "concat", "fairseq", "half"]),
    "scale_input": Opt(st.booleans(), st.sampled_from(["yes", 1, None])),
    "max_positions": integer(st.one_of(st.none(), st.integers(16, 64))),
    "init_std": number(st.floats(0.0, 0.5)),
    "scaling": Opt(
        st.sampled_from(
            [
                None,
                {"rope_type": "linear", "factor": 2.0},
                {"rope_type": "dynamic", "factor": 2.0},
                {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
            ]
        ),
        st.sampled_from(
            [{"rope_type": "linear", "factor": math.nan}, {"rope_type": "nope"}, "linear", 2.0]
        ),
    ),
    "rotary_dim": integer(st.one_of(st.none(), st.sampled_from([2, 4, 8]))),
    "partial_rotary_factor": number(st.one_of(st.none(), st.sampled_from([0.25, 0.5, 1.0]))),
    "angle_dtype": choice(["float64", "float32"]),
    "cache_len": integer(st.one_of(st.none(), st.integers(1, 64))),
    "mrope_section": Opt(st.none(), st.sampled_from([[1, 1], [1, 1, 1, 1], "2,1,1", [-1, 2, 3]])),
    "interleaved": Opt(st.booleans()),
    "scale_base": number(st.floats(1.0, 2048.0)),
    "gamma": number(st.floats(0.05, 4.0)),
    "center": integer(st.one_of(st.none(), st.integers(0, 40))),
    "num_buckets": integer(st.integers(2, 64)),
    "max_distance": integer(st.integers(1, 300)),
    "bidirectional": Opt(st.one_of(st.none(), st.booleans()), st.sampled_from(["no", 0])),
    "variant": choice(["log", "power"]),
    "eps": number(st.floats(1e-4, 1.0)),
    "mlp_width": integer(st.integers(1, 16)),
    "init_c": number(st.floats(-2.0, 2.0)),
    "init_threshold": number(st.floats(1e-3, 1e4)),
    "d_prime": integer(st.integers(1, 16).map(lambda n: 2 * n)),
    "values": Opt(st.booleans()),
    "position_buckets": integer(st.integers(-1, 12)),
    "max_relative_positions": integer(st.integers(1, 40)),
    "pos_att_type": choice(["c2p|p2c", "c2p", "p2c", ""]),
    "norm_rel_ebd": Opt(st.booleans()),
    "npos_max": integer(st.one_of(st.none(), st.integers(1, 16))),
}
FALLBACK = Opt(st.just(None), JUNK)  # an option added after this file: defaults, or nonsense
MODEL_NAMES = {"dim", "num_heads", "head_dim", "max_len", "causal", "name", "encoding"}


@st.composite
def registry_call(draw: st.DrawFn, name: str) -> dict[str, Any]:
    """``build`` keywords for encoding ``name``: a small model shape and its own options."""
    specs = {k: REGISTRY_OPTIONS.get(k, FALLBACK) for k in registry.options(name)}
    specs["max_len"] = integer(st.integers(8, 64), huge=False)
    opts = {k: v for k, v in draw(options(specs)).items() if v is not None}
    heads = draw(st.sampled_from([1, 2, 4]))
    shape = {"dim": heads * draw(st.sampled_from([4, 8])), "num_heads": heads}
    shape["causal"] = draw(st.booleans())
    if draw(st.sampled_from([False] * 15 + [True])):
        opts["bogus_option"] = 1  # an unknown option: a TypeError naming it
    return {"max_len": 16, **shape, **opts}


@pytest.mark.parametrize("name", registry.names())
def test_registry_build(name: str) -> None:
    """Every registered encoding, built with generated options and run inside Attention (or on
    the embeddings, for the absolute family): finite, repeatable, and (schemes of ``j - i``) the
    same 2**31 positions further."""

    @fuzz(
        BUDGETS["registry"],
        kwargs=registry_call(name),
        shape=st.tuples(st.integers(1, 2), st.integers(0, 6)),
        offset=st.sampled_from([None, 0, 5, 2**31]),
        seed=st.integers(0, 2**16),
    )
    def registry_case(kwargs, shape, offset, seed) -> None:
        enc = outcome(lambda: registry.build(name, **kwargs), MODEL_NAMES | set(kwargs))
        if enc is None:
            return
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(*shape, kwargs["dim"], generator=gen)
        pos = None if offset is None else torch.arange(shape[1]) + offset
        if enc.family in ("none", "absolute"):
            run = (lambda p: enc(x, p)) if enc.family == "absolute" else (lambda p: enc(x))
        else:
            attn = Attention(
                kwargs["dim"], kwargs["num_heads"], causal=kwargs["causal"], encoding=enc
            )
            attn.eval()
            run = lambda p: attn(x, p)  # noqa: E731
        with torch.no_grad():
            out = outcome(lambda: run(pos), {"positions", "x"})
            if out is None:
                return
            assert out.shape == x.shape and torch.isfinite(out).all()
            assert torch.equal(run(pos), out)
            if enc.family in ("bias", "relative") and name not in ("fire", "cope"):
                close(run(torch.arange(shape[1]) + 2**31), run(torch.arange(shape[1])).double())

    registry_case()


def test_registry_rope_partial_factor_error_names_it() -> None:
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        registry.build("rope", dim=4, num_heads=1, partial_rotary_factor=0.25)


TOTAL_BUDGET = (
    BUDGETS["bias"] * len(BIAS_OPTIONS)
    + BUDGETS["relative"] * len(RELATIVE)
    + BUDGETS["absolute"] * len(ABSOLUTE)
    + BUDGETS["rotary"] * len(ROTARY)
    + BUDGETS["functional"] * len(FUNCTIONAL)
    + BUDGETS["registry"] * len(registry.names())
)


def test_the_budgets_add_up_to_at_least_10000_cases() -> None:
    assert TOTAL_BUDGET >= 10_000, TOTAL_BUDGET
