"""The FlexAttention Self-Extend and Dual Chunk Attention (:mod:`posenc.extend.methods.flex`: one
``flex_attention`` call per key set, merged by log-sum-exp) against the explicit path
(:mod:`posenc.extend.methods.explicit`, itself tested against the papers' code): prefill, decode, rows
at different positions, left padding with transformers' masks and positions (rows that see no
key included), grouped-query heads, a soft cap, both rotary layouts, inside plain and soft-capped
transformers models; planted faults (a neighbour band off by one, a log2 log-sum-exp) are caught.
(The positions each set rotates by are one definition for every path, :mod:`posenc.extend.methods.keysets`:
a fault there is caught against the naive references, ``tests/test_extend_keysets.py``.) Eager flex on the CPU; the compiled kernel on CUDA.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import posenc.extend.methods.explicit as explicit_module
import posenc.extend.methods.flex as flex
from _decode import hf_prefill_then_decode
from posenc.extend.methods.explicit import keyset_attention
from posenc.extend.methods.keysets import by_method

self_extend_attention = by_method(keyset_attention, "self_extend")
dual_chunk_attention = by_method(keyset_attention, "dual_chunk")


pytestmark = pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")

TOL = 1e-5
INV_FREQ = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
SELF_EXTEND = [(4, 8), (3, 7), (2, 1), (4, 300)]  # (group, window); 300: wider than t
DUAL_CHUNK = [(12, 4), (9, 2), (20, 3), (400, 3)]  # (chunk, local); 400: wider than t
SHAPES = [(45, 45), (30, 200), (1, 200)]  # (queries s, keys t): prefill, after a cache, decode
EXPLICIT = {"self_extend": self_extend_attention, "dual_chunk": dual_chunk_attention}
FLEX = {m: by_method(flex.keyset_flex, m) for m in ("self_extend", "dual_chunk")}
OPTIONS = {
    "self_extend": {"group_size": 3, "neighbor_window": 7},
    "dual_chunk": {"chunk_size": 12, "local_size": 4},
}


def qkv(s: int, t: int, heads: tuple[int, int] = (4, 2), seed: int = 0, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    h, hk = heads
    q, k, v = (torch.randn(2, n, m, 16, generator=g) for n, m in ((h, s), (hk, t), (hk, t)))
    return q.to(device), k.to(device), v.to(device)


def left_padded(s: int, t: int, pads: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q_pos [2, s], keep [2, 1, s, t])`` as transformers builds them for a left-padded batch:
    positions ``(mask.cumsum(-1) - 1).clamp(min=0)``, causality by slot and no padded key."""
    mask = torch.ones(2, t, dtype=torch.long)
    for row, pad in enumerate(pads):
        mask[row, :pad] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [2, t]
    causal = torch.ones(s, t, dtype=torch.bool).tril(diagonal=t - s)  # [s, t]
    return positions[:, t - s :], causal[None, None] & mask.bool()[:, None, None, :]


def diff(method: str, s: int, t: int, shift: int = 0, device: str = "cpu", **options: Any) -> float:
    """Largest difference of the flex and explicit paths: ``s`` queries, the last of ``t`` keys,
    positions from 0 (batch row 1 ``shift`` later); ``options`` may replace ``q_pos``, ``heads``."""
    q, k, v = qkv(s, t, options.pop("heads", (4, 2)), device=device)
    pos = torch.arange(t - s, t).expand(2, -1) + torch.tensor([[0], [shift]])
    pos = options.pop("q_pos", pos).to(device)
    common = {"inv_freq": INV_FREQ.to(device), "scale": 0.25, **OPTIONS[method], **options}
    got = FLEX[method](q, k, v, pos, **common)
    want = EXPLICIT[method](q, k, v, pos, **common)
    assert got.dtype == want.dtype and got.shape == want.shape
    return float((got - want).abs().max())


# --- attention level -----------------------------------------------------------------------------


@pytest.mark.parametrize(("group", "window"), SELF_EXTEND)
def test_self_extend_flex_equals_explicit(group: int, window: int) -> None:
    for s, t in SHAPES:  # prefill, a prefill after a cache, decode (s = 1)
        assert diff("self_extend", s, t, group_size=group, neighbor_window=window) <= TOL, (s, t)


@pytest.mark.parametrize(("chunk", "local"), DUAL_CHUNK)
def test_dual_chunk_flex_equals_explicit(chunk: int, local: int) -> None:
    for s, t in SHAPES:
        assert diff("dual_chunk", s, t, chunk_size=chunk, local_size=local) <= TOL, (s, t)


@pytest.mark.parametrize("method", ["self_extend", "dual_chunk"])
def test_rows_at_different_positions_and_heads(method: str) -> None:
    """Batch rows at different offsets (DCA's chunks cut at different slots in each row), and
    grouped-query heads of every ratio."""
    assert diff(method, 30, 70, shift=13) <= TOL
    for heads in ((2, 2), (6, 1), (4, 4)):
        assert diff(method, 30, 70, heads=heads) <= TOL, heads


@pytest.mark.parametrize("method", ["self_extend", "dual_chunk"])
def test_soft_cap_and_layouts(method: str) -> None:
    """Gemma-2's soft cap as a ``score_mod`` (a cap of 1 changes these logits a lot), the
    interleaved (GPT-J) layout, an attention scaling, and the three together."""
    assert diff(method, 45, 45, softcap=1.0) <= TOL
    assert diff(method, 30, 70, layout="interleaved", attention_scaling=0.8) <= TOL
    assert diff(method, 1, 70, layout="interleaved", softcap=1.0) <= TOL


@pytest.mark.parametrize("block_elements", [1 << 24, 1])  # one block of rows; 16 rows a block
@pytest.mark.parametrize("method", ["self_extend", "dual_chunk"])
def test_left_padding(monkeypatch: pytest.MonkeyPatch, method: str, block_elements: int) -> None:
    """transformers' left-padded masks and positions: padded query rows see no key at all and
    get the explicit path's uniform weights (over the keys of their block of rows); a decode
    step's one-row ``[b, 1, 1, t]`` padding mask; a soft cap over padding."""
    monkeypatch.setattr(explicit_module, "BLOCK_ELEMENTS", block_elements)
    q_pos, keep = left_padded(12, 60, (0, 30))  # a prefill after a cache
    assert diff(method, 12, 60, q_pos=q_pos, keep=keep) <= TOL
    q_pos, keep = left_padded(40, 40, (3, 20))  # rows 0..2 and 0..19 see no key
    assert diff(method, 40, 40, q_pos=q_pos, keep=keep) <= TOL
    assert diff(method, 40, 40, q_pos=q_pos, keep=keep, softcap=2.0) <= TOL
    q_pos, keep = left_padded(1, 60, (0, 9))
    assert diff(method, 1, 60, q_pos=q_pos, keep=keep[:, :, -1:]) <= TOL


def test_flex_log_sum_exp_is_natural_and_empty_rows_are_minus_infinity() -> None:
    """What the merge relies on: flex's log-sum-exp is ``ln sum exp(score)`` over the unmasked
    keys (not log2), and a row with no key has ``-inf`` there and output 0."""
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

    q, k, v = qkv(10, 12)
    limit = torch.tensor(3)  # rows 0..2 see no key

    def mod(b: torch.Tensor, h: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor) -> torch.Tensor:
        return (ki <= qi + 2) & (qi >= limit)

    mask = create_block_mask(mod, None, None, 10, 12, device="cpu")
    out, aux = flex_attention(
        q, k, v, block_mask=mask, scale=0.25, enable_gqa=True, return_aux=AuxRequest(lse=True)
    )
    scores = q @ k.repeat_interleave(2, 1).transpose(-1, -2) * 0.25  # [2, 4, 10, 12]
    seen = torch.ones(10, 12, dtype=torch.bool).tril(2)
    want = torch.logsumexp(scores.masked_fill(~seen, -math.inf), -1)  # [2, 4, 10]
    assert float((aux.lse[..., 3:] - want[..., 3:]).abs().max()) <= TOL
    assert torch.isneginf(aux.lse[..., :3]).all() and not out[:, :, :3].any()


def test_planted_faults_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparisons above fail on a neighbour band one key too wide and on log-sum-exps
    merged as if they were base 2."""
    right_mod, right_merge = flex._mask_mod, flex.merge
    assert diff("self_extend", 45, 45) <= TOL and diff("dual_chunk", 45, 45) <= TOL

    def wide_band(q_pos, k_pos, keep, unit, lo, hi):  # distance w counted as a neighbour
        if unit == 1:  # Self-Extend's sets: near [0, w + 1), far [w + 1, ...)
            lo, hi = (lo + 1 if lo else lo), (hi + 1 if hi < flex.UNBOUNDED else hi)
        return right_mod(q_pos, k_pos, keep, unit, lo, hi)

    def log2_merge(parts: list[flex.Part], sinks: Any = None) -> torch.Tensor:
        return right_merge([(o, lse / math.log(2)) for o, lse in parts], sinks)

    monkeypatch.setattr(flex, "_mask_mod", wide_band)
    assert diff("self_extend", 45, 45) > 1e-3
    monkeypatch.setattr(flex, "_mask_mod", right_mod)
    monkeypatch.setattr(flex, "merge", log2_merge)
    assert diff("self_extend", 45, 45) > 1e-3
    assert diff("dual_chunk", 45, 45) > 1e-3
    monkeypatch.setattr(flex, "merge", right_merge)
    assert diff("dual_chunk", 45, 45) <= TOL


# --- inside transformers models ------------------------------------------------------------------


def prefill_and_decode(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Logits of a left-padded prefill of all but 4 tokens, then 4 one-token decode steps."""
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    n = ids.shape[1] - 4
    return hf_prefill_then_decode(model, ids, n, mask=mask, positions=positions)


@pytest.mark.parametrize(("model_type", "index"), [("llama", 1), ("gemma2", 0)])
def test_patched_model_flex_equals_explicit(
    monkeypatch: pytest.MonkeyPatch, model_type: str, index: int
) -> None:
    """A patched model's attention swapped for the flex functions against the explicit path:
    a left-padded batch (transformers' own masks), prefill then decode; Gemma-2's soft cap."""
    import posenc.extend.methods.fused as fused
    from posenc.hf import apply_posenc
    from test_extend_attention import EXTENSIONS, tiny
    from test_extend_hybrid import EXTENSIONS as HYBRID_EXTENSIONS
    from test_extend_hybrid import tiny as hybrid_tiny

    if model_type == "gemma2":
        model = apply_posenc(hybrid_tiny("gemma2"), extension=HYBRID_EXTENSIONS[index])
    else:
        model = apply_posenc(tiny(model_type), extension=EXTENSIONS[index])
    ids = torch.randint(1, 64, (2, 34), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :9] = 0
    monkeypatch.setattr(fused, "PATH", "explicit")
    want = prefill_and_decode(model, ids, mask)
    monkeypatch.setattr(fused, "PATH", "flex")  # the patch's own dispatch chooses flex
    calls: list[str] = []
    for name in ("keyset_flex",):
        fn = getattr(flex, name)
        monkeypatch.setattr(
            flex, name, lambda *a, _fn=fn, _n=name, **kw: calls.append(_n) or _fn(*a, **kw)
        )
    got = prefill_and_decode(model, ids, mask)
    assert calls and float((got - want).abs().max()) <= TOL


def test_a_path_that_is_not_one_says_which_are(monkeypatch: pytest.MonkeyPatch) -> None:
    import posenc.extend.methods.fused as fused

    q, k, v = qkv(8, 8)
    monkeypatch.setattr(fused, "PATH", "flash")
    with pytest.raises(ValueError, match="must be one of auto, fused, explicit, flex, got 'flash'"):
        by_method(fused.keyset, "self_extend")(q, k, v, torch.arange(8)[None], inv_freq=INV_FREQ, scale=0.25,
                          **OPTIONS["self_extend"])  # fmt: skip


# --- compiled -------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["self_extend", "dual_chunk"])
def test_one_graph_without_host_reads(method: str) -> None:
    """Capture-safe: dynamo traces a whole call (a padding mask, a soft cap) into one graph,
    which any host read of a tensor's value (``.item()``, ``bool(t)``) would break."""
    q, k, v = qkv(40, 40)
    q_pos, keep = left_padded(40, 40, (0, 7))
    common = {"inv_freq": INV_FREQ, "scale": 0.25, "keep": keep, "softcap": 2.0, **OPTIONS[method]}
    traced = torch.compile(FLEX[method], backend="eager", fullgraph=True)
    got = traced(q, k, v, q_pos, **common)
    assert float((got - EXPLICIT[method](q, k, v, q_pos, **common)).abs().max()) <= TOL


def test_compiled_flex_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.compile(flex_attention)`` on the CPU: torch 2.13's inductor refuses a log-sum-exp
    there, which this path needs for its merge (so COMPILED=None runs eager flex on the CPU)."""
    monkeypatch.setattr(flex, "COMPILED", True)
    try:
        assert diff("self_extend", 64, 64) <= TOL
    except RuntimeError as error:
        if "return_lse` is not supported" not in str(error):
            raise
        pytest.skip("torch.compile of flex_attention on CPU: `return_lse` is not supported yet")
    assert diff("dual_chunk", 64, 64) <= TOL


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the compiled FlexAttention kernel needs CUDA"
)
@pytest.mark.parametrize("method", ["self_extend", "dual_chunk"])
def test_compiled_flex_on_cuda_equals_explicit(
    monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """The compiled kernel (COMPILED=None compiles on CUDA) against the explicit path on CUDA in
    float32 (TF32 off, torch's default): prefill, decode, left padding, a soft cap, GQA."""
    monkeypatch.setattr(flex, "COMPILED", None)
    cuda = {"device": "cuda"}
    assert diff(method, 200, 200, **cuda) <= 1e-4
    assert diff(method, 1, 300, **cuda) <= 1e-4
    assert diff(method, 64, 64, heads=(6, 1), softcap=1.0, **cuda) <= 1e-4
    q_pos, keep = left_padded(40, 40, (0, 7))
    assert diff(method, 40, 40, q_pos=q_pos, keep=keep.cuda(), **cuda) <= 1e-4


# --- inputs, dtypes, compiles -----------------------------------------------------------------


@pytest.mark.parametrize("method", ["self_extend", "dual_chunk"])
def test_positions_and_mask_broadcast_as_the_explicit_path_takes_them(method: str) -> None:
    """``q_pos [1, s]`` for a batch of 2 and a ``keep`` of one batch row: the same answer as
    the explicit path (the kernel indexes both by batch row, so they are expanded first)."""
    q, k, v = qkv(20, 30)
    q_pos = torch.arange(10, 30)[None]  # [1, s]
    keep = torch.ones(1, 1, 20, 30, dtype=torch.bool).tril(diagonal=10)  # [1, 1, s, t]
    keep[..., :3] = False
    common = {"inv_freq": INV_FREQ, "scale": 0.25, "keep": keep, **OPTIONS[method]}
    got = FLEX[method](q, k, v, q_pos, **common)
    assert float((got - EXPLICIT[method](q, k, v, q_pos, **common)).abs().max()) <= TOL


@pytest.mark.parametrize("method", ["self_extend", "dual_chunk"])
def test_a_per_head_mask_or_wrong_positions_are_refused_in_one_line(method: str) -> None:
    q, k, v = qkv(8, 8)
    common = {"inv_freq": INV_FREQ, "scale": 0.25, **OPTIONS[method]}
    per_head = torch.ones(2, 4, 8, 8, dtype=torch.bool)
    with pytest.raises(
        ValueError, match=r"keep must be a bool mask \[b, 1, s, t\] = \[2, 1, 8, 8\]"
    ):
        FLEX[method](q, k, v, torch.arange(8)[None], keep=per_head, **common)
    with pytest.raises(ValueError, match=r"q_pos must be \[b, s\] = \[2, 8\] or \[1, 8\]"):
        FLEX[method](q, k, v, torch.arange(7)[None], **common)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("method", ["self_extend", "dual_chunk"])
def test_half_precision_is_as_close_to_float32_as_the_explicit_path(
    method: str, dtype: torch.dtype
) -> None:
    """In bf16/fp16 both paths round differently; each stays within a few of the dtype's steps
    of the float32 answer, flex no farther than twice the explicit path's distance (+ a step)."""
    q, k, v = qkv(45, 45)
    q_pos = torch.arange(45).expand(2, -1)
    common = {"inv_freq": INV_FREQ, "scale": 0.25, **OPTIONS[method]}
    want = EXPLICIT[method](q, k, v, q_pos, **common)
    half = [x.to(dtype) for x in (q, k, v)]
    ours = float((FLEX[method](*half, q_pos, **common).float() - want).abs().max())
    theirs = float((EXPLICIT[method](*half, q_pos, **common).float() - want).abs().max())
    step = torch.finfo(dtype).eps
    assert ours <= 2 * theirs + step and ours <= 8 * step, (ours, theirs)


@pytest.mark.long  # about 19 s of CPU compilation: `make test-long`
def test_compiled_block_masks_and_kernels_are_reused_across_sets_lengths_and_methods() -> None:
    """Every set of both methods is one mask function: after Self-Extend's prefills at two
    lengths (with and without a padding mask) and a few decode steps have compiled their
    graphs, DCA's three sets and more steps at new lengths compile nothing more (separate
    lambdas or stride-0 masks compiled one graph each, past dynamo's recompile limit of 8)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = flex._block_mask_fn(True)
    plain = flex._kernels(torch.device("cpu"))[1]  # eager flex: the CPU kernel takes no lse

    def run(method: str, shapes: list[tuple[int, int]]) -> int:
        for s, t in shapes:
            for padded in (False, True):
                q, k, v = qkv(s, t)
                q_pos = torch.arange(t - s, t).expand(2, -1)
                keep = torch.ones(2, 1, s, t, dtype=torch.bool).tril(diagonal=t - s)
                keep[1, ..., :3] = False
                common = {"inv_freq": INV_FREQ, "scale": 0.25, **OPTIONS[method]}
                got = FLEX[method](q, k, v, q_pos, keep=keep if padded else None, **common)
                want = EXPLICIT[method](q, k, v, q_pos, keep=keep if padded else None, **common)
                assert float((got - want).abs().max()) <= TOL
        return counters["stats"]["unique_graphs"]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(flex, "_kernels", lambda device: (compiled, plain))
        warm = run("self_extend", [(40, 40), (56, 56), (1, 57), (1, 58)])
        assert 1 <= warm <= 10, warm
        assert run("dual_chunk", [(48, 48), (64, 64), (1, 65), (1, 70)]) == warm
        assert run("self_extend", [(1, 80), (30, 90)]) == warm
