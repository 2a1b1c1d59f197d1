"""Fused RoPE kernels (posenc.kernels) against the pure-PyTorch reference, which is itself checked
against a float64 pair-by-pair formula and transformers' LLaMA and GPT-J functions.

Each kernel test runs on every backend that can run here: the native CPU kernel, the Triton
kernel (on the CPU under TRITON_INTERPRET=1, on a GPU when there is one) and the torch path.
Sizes stay small: the Triton interpreter runs each program in Python.
"""

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.kernels import (
    apply_rotary_reference,
    available_backends,
    backends,
    rope_op,
    rope_qk,
    select_backend,
)
from posenc.kernels.cpu_rope import cpu_kernel_status

CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
TRITON_REASON = rope_op.triton_status()
CPU_REASON = cpu_kernel_status()

KERNELS = [
    pytest.param(
        ("cpu", "cpu"),
        id="cpu",
        marks=pytest.mark.skipif(bool(CPU_REASON), reason=CPU_REASON or "-"),
    ),
    pytest.param(
        ("triton", "cpu"),
        id="triton-interpret",
        marks=pytest.mark.skipif(
            bool(TRITON_REASON) or not INTERPRET,
            reason=TRITON_REASON or "set TRITON_INTERPRET=1 to run the Triton kernel on the CPU",
        ),
    ),
    pytest.param(
        ("triton", "cuda"),
        id="triton-cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not CUDA or bool(TRITON_REASON), reason="needs CUDA and triton"),
        ],
    ),
    pytest.param(("torch", "cpu"), id="torch"),
]


def tables(
    n: int, r: int, device: str = "cpu", base: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos, sin [n, r/2] of positions 0..n-1, angles in float64."""
    inv_freq = base ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)  # [r/2]
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq  # [n, r/2]
    return ang.cos().float().to(device), ang.sin().float().to(device)


def expected(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor, layout: str, r: int
) -> torch.Tensor:
    """Reference for x [b, h, s, d] with table rows pos [s] or [b, s]."""
    rows_c, rows_s = cos[pos], sin[pos]  # [s, r/2] or [b, s, r/2]
    if pos.dim() == 2:
        rows_c, rows_s = rows_c[:, None], rows_s[:, None]  # [b, 1, s, r/2]
    return apply_rotary_reference(x, rows_c, rows_s, layout, r)


def assert_close(actual: torch.Tensor, want: torch.Tensor) -> None:
    assert actual.dtype == want.dtype and actual.shape == want.shape
    if actual.dtype == torch.bfloat16:
        # float32 math then one rounding; an FMA, or the Triton interpreter's truncating cast,
        # may land on the neighbouring bf16 value: 1 ulp = 2**-8 relative.
        torch.testing.assert_close(actual.float(), want.float(), rtol=2**-7, atol=2**-8)
    else:
        torch.testing.assert_close(actual, want, rtol=1e-5, atol=1e-5)


def pair_formula(
    x: torch.Tensor, pos: torch.Tensor, r: int, layout: str, base: float = 10000.0
) -> torch.Tensor:
    """RoPE written out pair by pair in float64: (a, b) -> (a cos - b sin, b cos + a sin)."""
    x = x.double()
    out = x.clone()
    for i in range(r // 2):
        theta = pos.double() * base ** (-2 * i / r)  # [s]
        c, s = theta.cos(), theta.sin()
        ia, ib = (i, i + r // 2) if layout == "half" else (2 * i, 2 * i + 1)
        a, b = x[..., ia], x[..., ib]
        out[..., ia] = a * c - b * s
        out[..., ib] = b * c + a * s
    return out


# --- the reference against independent formulas ------------------------------------------------


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("r", [16, 10])
def test_reference_equals_pair_formula(layout: str, r: int) -> None:
    x = torch.randn(2, 3, 9, 16, dtype=torch.float64)
    pos = torch.arange(4, 13)
    cos, sin = tables(20, r)
    got = apply_rotary_reference(x, cos[pos].double(), sin[pos].double(), layout, r)
    want = pair_formula(x, pos, r, layout)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)  # float32 tables: 2**-24 each
    assert torch.equal(got[..., r:], x[..., r:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_qk_matches_transformers_llama(dtype: torch.dtype) -> None:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    q, k = torch.randn(2, 4, 11, 32, dtype=dtype), torch.randn(2, 2, 11, 32, dtype=dtype)
    cos, sin = tables(11, 32)
    cos_hf = torch.cat((cos, cos), -1)[None]  # [1, s, d], as LlamaRotaryEmbedding returns
    sin_hf = torch.cat((sin, sin), -1)[None]
    want_q, want_k = apply_rotary_pos_emb(q.float(), k.float(), cos_hf, sin_hf)
    for backend in available_backends("cpu"):
        got_q, got_k = rope_qk(q, k, cos, sin, backend=backend)
        assert_close(got_q, want_q.to(dtype))
        assert_close(got_k, want_k.to(dtype))
        if backend in ("cpu", "torch"):
            # Same float32 operations in the same order (no FMA): bit for bit.
            assert torch.equal(got_q, want_q.to(dtype)) and torch.equal(got_k, want_k.to(dtype))


def test_interleaved_matches_transformers_gptj() -> None:
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb

    q = torch.randn(2, 7, 3, 16)  # GPT-J's layout [b, s, h, d]
    cos, sin = tables(7, 16)
    want = apply_rotary_pos_emb(q, sin[None], cos[None])  # rotate_every_two
    for backend in available_backends("cpu"):
        got, _ = rope_qk(
            q, q.clone(), cos, sin, layout="interleaved", seq_layout="bshd", backend=backend
        )
        assert_close(got, want)


# --- every kernel against the reference ---------------------------------------------------------


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("s", "d", "r"), [(1, 16, 16), (7, 16, 10), (33, 64, 64), (33, 64, 32), (33, 128, 96)]
)
def test_forward_matches_reference(
    kernel, layout: str, dtype: torch.dtype, s: int, d: int, r: int
) -> None:
    backend, device = kernel
    q = torch.randn(2, 4, s, d, dtype=dtype, device=device)
    k = torch.randn(2, 2, s, d, dtype=dtype, device=device)  # GQA: 4 query heads, 2 key heads
    q0, k0 = q.clone(), k.clone()
    cos, sin = tables(s, r, device)
    got_q, got_k = rope_qk(q, k, cos, sin, layout=layout, rotary_dim=r, backend=backend)
    pos = torch.arange(s, device=device)
    assert_close(got_q, expected(q, cos, sin, pos, layout, r))
    assert_close(got_k, expected(k, cos, sin, pos, layout, r))
    assert torch.equal(got_q[..., r:], q[..., r:])  # partial rotary: the tail is copied through
    assert torch.equal(q, q0) and torch.equal(k, k0)  # out of place: inputs untouched


@pytest.mark.parametrize("kernel", [k for k in KERNELS if "triton" in k.id])
def test_triton_head_groups(kernel, monkeypatch: pytest.MonkeyPatch) -> None:
    from posenc.kernels import triton_rope

    # Several heads per program (what long sequences get on a GPU), with head counts that do
    # not divide into the groups.
    monkeypatch.setattr(triton_rope, "MIN_PROGRAMS_TO_GROUP_HEADS", 0)
    _, device = kernel
    q = torch.randn(2, 6, 9, 32, device=device)
    k = torch.randn(2, 3, 9, 32, device=device)
    cos, sin = tables(9, 32, device)
    got_q, got_k = rope_qk(q, k, cos, sin, backend="triton")
    pos = torch.arange(9, device=device)
    assert_close(got_q, expected(q, cos, sin, pos, "half", 32))
    assert_close(got_k, expected(k, cos, sin, pos, "half", 32))


def test_imports_without_triton() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch, posenc.kernels as K\n"
        "assert 'triton' not in K.available_backends('cpu'), K.available_backends('cpu')\n"
        "x = torch.randn(1, 1, 2, 4); c = torch.ones(2, 2)\n"
        "K.rope_qk(x, x.clone(), c, c)\n"
        "try:\n"
        "    K.rope_qk(x, x.clone(), c, c, backend='triton')\n"
        "except ValueError as e:\n"
        "    assert 'triton is not importable' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('no error')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


@pytest.mark.parametrize("kernel", KERNELS)
def test_bshd_and_strided_views(kernel) -> None:
    backend, device = kernel
    b, s, h, hk, d = 2, 5, 3, 1, 16
    qkv = torch.randn(b, s, (h + 2 * hk) * d, device=device)
    q = qkv[..., : h * d].unflatten(-1, (h, d))  # [b, s, h, d], a strided slice of qkv
    k = qkv[..., h * d : (h + hk) * d].unflatten(-1, (hk, d))  # [b, s, hk, d]
    cos, sin = tables(s, d, device)
    got_q, got_k = rope_qk(q, k, cos, sin, seq_layout="bshd", backend=backend)
    pos = torch.arange(s, device=device)
    assert got_q.shape == q.shape and got_k.shape == k.shape
    assert_close(got_q.transpose(1, 2), expected(q.transpose(1, 2), cos, sin, pos, "half", d))
    assert_close(got_k.transpose(1, 2), expected(k.transpose(1, 2), cos, sin, pos, "half", d))
    # Same values through an explicitly transposed [b, h, s, d] view.
    alt_q, _ = rope_qk(q.transpose(1, 2), k.transpose(1, 2), cos, sin, backend=backend)
    assert torch.equal(alt_q, got_q.transpose(1, 2))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_positions_offsets_and_batches(kernel, layout: str) -> None:
    backend, device = kernel
    b, s, d = 2, 7, 16
    cos, sin = tables(40, d, device)
    q, k = torch.randn(b, 2, s, d, device=device), torch.randn(b, 1, s, d, device=device)
    # An offset (KV cache): positions 13..19 equal the last 7 rows of a 20-long sequence.
    pos = torch.arange(13, 20, device=device)
    got_q, got_k = rope_qk(q, k, cos, sin, positions=pos, layout=layout, backend=backend)
    long_q = torch.cat((torch.randn(b, 2, 13, d, device=device), q), dim=2)  # [b, 2, 20, d]
    long_k = torch.cat((torch.randn(b, 1, 13, d, device=device), k), dim=2)
    full_q, full_k = rope_qk(long_q, long_k, cos[:20], sin[:20], layout=layout, backend=backend)
    assert_close(got_q, full_q[:, :, 13:])
    assert_close(got_k, full_k[:, :, 13:])
    # Per-batch positions [b, s] (left padding, packing).
    pos_b = torch.stack((torch.arange(s), torch.arange(30, 30 + s).flip(0))).to(device)
    got_q, got_k = rope_qk(q, k, cos, sin, positions=pos_b, layout=layout, backend=backend)
    assert_close(got_q, expected(q, cos, sin, pos_b, layout, d))
    assert_close(got_k, expected(k, cos, sin, pos_b, layout, d))
    # Per-batch tables [b, s, r/2] without positions (already gathered rows).
    cb, sb = cos[pos_b], sin[pos_b]  # [b, s, r/2]
    got_q2, _ = rope_qk(q, k, cb, sb, layout=layout, backend=backend)
    assert_close(got_q2, got_q)


@pytest.mark.parametrize("kernel", KERNELS)
def test_kv_cache_k_has_its_own_positions(kernel) -> None:
    backend, device = kernel
    d, s, t = 16, 3, 13
    cos, sin = tables(t, d, device)
    q, k = torch.randn(1, 4, s, d, device=device), torch.randn(1, 2, t, d, device=device)
    pos_q, pos_k = torch.arange(t - s, t, device=device), torch.arange(t, device=device)
    got_q, got_k = rope_qk(q, k, cos, sin, positions=pos_q, k_positions=pos_k, backend=backend)
    assert_close(got_q, expected(q, cos, sin, pos_q, "half", d))
    assert_close(got_k, expected(k, cos, sin, pos_k, "half", d))
    # k's own table instead of positions: the same numbers.
    got_q2, got_k2 = rope_qk(
        q, k, cos[t - s :], sin[t - s :], cos_k=cos, sin_k=sin, backend=backend
    )
    assert_close(got_q2, got_q)
    assert_close(got_k2, got_k)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_varlen_equals_each_sequence_alone(kernel, dtype: torch.dtype) -> None:
    backend, device = kernel
    lens, h, hk, d = [3, 7, 1], 2, 1, 16
    cu = torch.tensor([0, 3, 10, 11], dtype=torch.int32, device=device)
    q = torch.randn(sum(lens), h, d, dtype=dtype, device=device)  # packed [total, h, d]
    k = torch.randn(sum(lens), hk, d, dtype=dtype, device=device)
    cos, sin = tables(max(lens), d, device)
    got_q, got_k = rope_qk(q, k, cos, sin, cu_seqlens=cu, backend=backend)
    assert got_q.shape == q.shape
    for i in range(len(lens)):
        a, e = int(cu[i]), int(cu[i + 1])
        pos = torch.arange(e - a, device=device)
        want_q = expected(q[a:e].transpose(0, 1)[None], cos, sin, pos, "half", d)[0].transpose(0, 1)
        want_k = expected(k[a:e].transpose(0, 1)[None], cos, sin, pos, "half", d)[0].transpose(0, 1)
        assert_close(got_q[a:e], want_q)
        assert_close(got_k[a:e], want_k)
    # Explicit positions (e.g. each sequence continuing a cache) override the derived ones.
    pos = torch.arange(5, 5 + sum(lens), device=device)
    big_c, big_s = tables(30, d, device)
    got_q, _ = rope_qk(q, k, big_c, big_s, cu_seqlens=cu, positions=pos, backend=backend)
    want = expected(q.transpose(0, 1)[None], big_c, big_s, pos, "half", d)[0].transpose(0, 1)
    assert_close(got_q, want)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("r", [16, 8])
def test_backward_matches_reference(kernel, layout: str, dtype: torch.dtype, r: int) -> None:
    backend, device = kernel
    s, d = 7, 16
    cos, sin = tables(s + 3, r, device)
    pos = torch.tensor([[3, 4, 5, 6, 7, 8, 9], [0, 1, 2, 3, 4, 5, 6]], device=device)
    q = torch.randn(2, 4, s, d, dtype=dtype, device=device, requires_grad=True)
    k = torch.randn(2, 2, s, d, dtype=dtype, device=device, requires_grad=True)
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    out = rope_qk(q, k, cos, sin, positions=pos, layout=layout, rotary_dim=r, backend=backend)
    got = torch.autograd.grad(out, (q, k), (gq, gk))
    ref = rope_qk(q, k, cos, sin, positions=pos, layout=layout, rotary_dim=r, backend="torch")
    want = torch.autograd.grad(ref, (q, k), (gq, gk))
    assert_close(got[0], want[0])
    assert_close(got[1], want[1])


@pytest.mark.parametrize("kernel", KERNELS)
def test_inplace_writes_into_q_and_k(kernel) -> None:
    backend, device = kernel
    cos, sin = tables(9, 16, device)
    q, k = torch.randn(2, 4, 9, 16, device=device), torch.randn(2, 2, 9, 16, device=device)
    want_q, want_k = rope_qk(q, k, cos[:, :4], sin[:, :4], backend=backend)  # partial: r = 8
    qi, ki = q.clone(), k.clone()
    got_q, got_k = rope_qk(qi, ki, cos[:, :4], sin[:, :4], inplace=True, backend=backend)
    assert got_q is qi and got_k is ki
    assert torch.equal(qi, want_q) and torch.equal(ki, want_k)
    # bshd views rotated in place write through to the caller's tensors.
    qb, kb = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()  # [b, s, h, d]
    rope_qk(qb, kb, cos[:, :4], sin[:, :4], seq_layout="bshd", inplace=True, backend=backend)
    assert torch.equal(qb.transpose(1, 2), want_q)


@pytest.mark.parametrize("kernel", KERNELS)
def test_inplace_backward(kernel) -> None:
    backend, device = kernel
    cos, sin = tables(5, 16, device)
    base_q = torch.randn(1, 2, 5, 16, device=device, requires_grad=True)
    base_k = torch.randn(1, 1, 5, 16, device=device, requires_grad=True)
    q, k = base_q * 1.0, base_k * 1.0  # non-leaf: in place is allowed under autograd
    out = rope_qk(q, k, cos, sin, inplace=True, backend=backend)
    g = torch.autograd.grad((out[0] ** 2).sum() + out[1].sum(), (base_q, base_k))
    ref = rope_qk(base_q, base_k, cos, sin, backend="torch")
    want = torch.autograd.grad((ref[0] ** 2).sum() + ref[1].sum(), (base_q, base_k))
    assert_close(g[0], want[0])
    assert_close(g[1], want[1])


@pytest.mark.parametrize("kernel", KERNELS)
def test_empty_inputs(kernel) -> None:
    backend, device = kernel
    cos, sin = tables(0, 16, device)
    q, k = torch.randn(2, 4, 0, 16, device=device), torch.randn(2, 2, 0, 16, device=device)
    got_q, got_k = rope_qk(q, k, cos, sin, backend=backend)
    assert got_q.shape == q.shape and got_k.shape == k.shape


@settings(max_examples=20, deadline=None)
@given(
    b=st.integers(1, 2),
    h=st.integers(1, 3),
    hk=st.integers(1, 3),
    s=st.integers(1, 40),
    half=st.integers(1, 40),
    tail=st.integers(0, 5),
    layout=st.sampled_from(["half", "interleaved"]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    bshd=st.booleans(),
)
def test_cpu_kernel_random_shapes(b, h, hk, s, half, tail, layout, dtype, bshd) -> None:
    if CPU_REASON:
        pytest.skip(CPU_REASON)
    r, d = 2 * half, 2 * half + tail
    cos, sin = tables(s + 2, r)
    pos = torch.randint(0, s + 2, (b, s))
    q, k = torch.randn(b, h, s, d, dtype=dtype), torch.randn(b, hk, s, d, dtype=dtype)
    kw = {"positions": pos, "layout": layout, "rotary_dim": r}
    if bshd:
        got = rope_qk(
            q.transpose(1, 2), k.transpose(1, 2), cos, sin, seq_layout="bshd", backend="cpu", **kw
        )
        got = (got[0].transpose(1, 2), got[1].transpose(1, 2))
    else:
        got = rope_qk(q, k, cos, sin, backend="cpu", **kw)
    assert_close(got[0], expected(q, cos, sin, pos, layout, r))
    assert_close(got[1], expected(k, cos, sin, pos, layout, r))


# --- properties ----------------------------------------------------------------------------------


def test_rotation_preserves_norm_and_scores_depend_on_offset_only() -> None:
    d = 32
    cos, sin = tables(64, d)
    q, k = torch.randn(1, 1, 1, d), torch.randn(1, 1, 1, d)

    def score(m: int, n: int) -> float:
        qm, kn = rope_qk(q, k, cos, sin, positions=torch.tensor([m]), k_positions=torch.tensor([n]))
        return float((qm * kn).sum())

    qm, _ = rope_qk(q, k, cos, sin, positions=torch.tensor([37]))
    torch.testing.assert_close(qm.norm(), q.norm())
    assert score(10, 3) == pytest.approx(score(40, 33), abs=1e-5)
    assert score(10, 3) != pytest.approx(score(10, 4), abs=1e-3)


def test_explicit_arange_positions_equal_default() -> None:
    cos, sin = tables(6, 16)
    q, k = torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 16)
    a = rope_qk(q, k, cos, sin)
    b = rope_qk(q, k, cos, sin, positions=torch.arange(6))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# --- dispatch -----------------------------------------------------------------------------------


def test_auto_dispatch_rule() -> None:
    cos, sin = tables(4, 8)
    x32 = torch.randn(1, 1, 4, 8)
    assert available_backends("cpu")[-1] == "torch"
    want_cpu = "cpu" if not CPU_REASON else "torch"
    assert select_backend("auto", x32, (cos, sin)) == want_cpu
    assert select_backend("auto", x32.bfloat16(), (cos, sin)) == want_cpu
    assert select_backend("auto", x32.double(), (cos, sin)) == "torch"  # no float64 kernel
    assert select_backend("auto", x32.half(), (cos, sin)) == "torch"  # no CPU float16 kernel
    assert select_backend("auto", x32, (cos.double(), sin.double())) == "torch"
    assert select_backend("auto", x32, (cos.requires_grad_(), sin)) == "torch"  # needs d cos
    with pytest.raises(ValueError, match="backend must be one of"):
        select_backend("cuda", x32, (cos, sin))
    with pytest.raises(
        ValueError, match=r"backend='cpu' cannot run this call.*float32 or bfloat16"
    ):
        rope_qk(x32.double(), x32.double(), cos.detach(), sin, backend="cpu")


def test_cos_sin_gradients_flow_on_auto() -> None:
    cos, sin = tables(4, 8)
    cos.requires_grad_()
    q, k = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
    out = rope_qk(q, k, cos, sin)
    out[0].sum().backward()
    assert cos.grad is not None and cos.grad.abs().sum() > 0


def test_auto_falls_back_to_torch_without_the_cpu_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "_cpu_ready", lambda: False)
    monkeypatch.setattr(backends, "cpu_kernel_status", lambda: "no C compiler found")
    monkeypatch.setattr(backends, "_AUTO_CHOICE", {})  # auto's memo of the constants patched above
    monkeypatch.setattr(rope_op, "_PLANS", {})  # and the plans of layouts run by the kernel
    cos, sin = tables(4, 8)
    x = torch.randn(1, 1, 4, 8)
    assert select_backend("auto", x, (cos, sin)) == "torch"
    with pytest.raises(ValueError, match="no C compiler"):
        rope_qk(x, x.clone(), cos, sin, backend="cpu")
    want = rope_qk(x, x.clone(), cos, sin, backend="torch")
    assert torch.equal(rope_qk(x, x.clone(), cos, sin)[0], want[0])


def test_functional_apply_rotary_qk_dispatches_to_the_kernels() -> None:
    from posenc.functional.rotary import apply_rotary_qk
    from posenc.rotary import RotaryEmbedding

    q, k = torch.randn(2, 4, 6, 16), torch.randn(2, 2, 10, 16)
    cos, sin = tables(12, 16)
    pos_q, pos_k = torch.arange(4, 10), torch.arange(10)
    args = (q, k, cos, sin, cos, sin)
    kw = {"positions": pos_q, "k_positions": pos_k}
    want = apply_rotary_qk(*args, backend="torch", **kw)
    for backend in ("auto", *available_backends("cpu")):
        got = apply_rotary_qk(*args, backend=backend, **kw)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), backend
    if not CPU_REASON:
        rope = RotaryEmbedding(16, backend="cpu")
        got = rope(q, k, pos_q, pos_k)
        want = RotaryEmbedding(16, backend="torch")(q, k, pos_q, pos_k)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# --- input errors -------------------------------------------------------------------------------


def test_bad_inputs_say_what_is_allowed() -> None:
    cos, sin = tables(5, 16)
    q, k = torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)
    with pytest.raises(ValueError, match="layout must be one of"):
        rope_qk(q, k, cos, sin, layout="neox")
    with pytest.raises(
        ValueError, match="rotary_dim must be an even integer in \\[2, head_dim=16\\]"
    ):
        rope_qk(q, k, cos, sin, rotary_dim=7)
    with pytest.raises(ValueError, match="rotary_dim must be an even integer"):
        rope_qk(q, k, tables(5, 18)[0], tables(5, 18)[1])
    with pytest.raises(ValueError, match="cos must be \\[n, r/2\\]"):
        rope_qk(q, k, cos, sin, rotary_dim=8)
    with pytest.raises(TypeError, match="positions must be an int32/int64 tensor"):
        rope_qk(q, k, cos, sin, positions=torch.arange(5.0))
    with pytest.raises(ValueError, match="positions must index the table's 5 rows"):
        rope_qk(q, k, cos, sin, positions=torch.arange(1, 6))
    with pytest.raises(ValueError, match="expected 5 rows, got 9"):
        rope_qk(q, k, *tables(9, 16))
    with pytest.raises(ValueError, match="backend='cpu' needs q and k of one dtype"):
        rope_qk(q, k.bfloat16(), cos, sin, backend="cpu")  # auto: the reference (test_rotary)
    with pytest.raises(ValueError, match="seq_layout must be one of"):
        rope_qk(q, k, cos, sin, seq_layout="sbhd")
    with pytest.raises(ValueError, match="k has 3 positions and q 5"):
        rope_qk(q, k[:, :, :3], cos, sin, positions=torch.arange(5))
    with pytest.raises(ValueError, match="cu_seqlens must rise from 0 to total=5"):
        rope_qk(
            q[0].transpose(0, 1), k[0].transpose(0, 1), cos, sin, cu_seqlens=torch.tensor([0, 4])
        )
    with pytest.raises(ValueError, match="packed \\[total, h, d\\]"):
        rope_qk(q, k, cos, sin, cu_seqlens=torch.tensor([0, 5]))


@pytest.mark.skipif(bool(CPU_REASON), reason=CPU_REASON or "-")
def test_cpu_launcher_checks_its_inputs() -> None:
    from posenc.kernels.cpu_rope import rope_cpu

    x = torch.randn(1, 2, 4, 8)
    cos, sin = torch.ones(1, 4, 4), torch.zeros(1, 4, 4)
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        rope_cpu(x.double(), x.double(), cos, sin, None, 8, False, False)
    with pytest.raises(ValueError, match="unit stride on head_dim"):
        rope_cpu(x.transpose(2, 3), x.transpose(2, 3), cos, sin, None, 8, False, False)
    with pytest.raises(ValueError, match="float32 \\[1 or b, n, r/2=4\\]"):
        rope_cpu(x, x, cos.double(), sin, None, 8, False, False)
    with pytest.raises(ValueError, match="positions must be int64"):
        rope_cpu(x, x, cos, sin, torch.zeros(1, 4, dtype=torch.int32), 8, False, False)
    out = torch.empty_like(x)
    rope_cpu(x, out, cos, sin, None, 8, False, False)  # cos 1, sin 0: the identity
    assert torch.equal(out, x)


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_inplace_needs_own_memory(backend: str) -> None:
    cos, sin = tables(5, 16)
    q, k = torch.randn(1, 2, 5, 32), torch.randn(1, 2, 5, 16)
    with pytest.raises(ValueError, match="contiguous along head_dim"):
        rope_qk(q[..., ::2], k, cos, sin, inplace=True, backend=backend)
    with pytest.raises(ValueError, match="contiguous along head_dim"):
        rope_qk(
            k.transpose(2, 3).contiguous().transpose(2, 3),
            k.clone(),
            cos,
            sin,
            inplace=True,
            backend=backend,
        )
    shared = torch.randn(1, 1, 5, 16).expand(1, 2, 5, 16)  # both heads are one memory
    with pytest.raises(ValueError, match="overlapping memory"):
        rope_qk(shared, k, cos, sin, inplace=True, backend=backend)
    with pytest.raises(ValueError, match="separate memory"):
        rope_qk(k, k, cos, sin, inplace=True, backend=backend)
    k0 = k.clone()
    rope_qk(q[..., :16], k, cos, sin, backend=backend)  # out of place on the same inputs: fine
    assert torch.equal(k, k0)


# --- torch.compile ------------------------------------------------------------------------------


class _TinyAttention(torch.nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        self.h, self.hk, self.d = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, heads * self.d)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.d)
        cos, sin = tables(64, self.d)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.h, self.d)  # [b, s, h, d]
        k, v = self.kv(x).view(b, s, 2, self.hk, self.d).unbind(2)  # [b, s, hk, d] each
        q, k = rope_qk(q, k, self.cos, self.sin, positions=positions, seq_layout="bshd")
        out = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
        )  # [b, h, s, d]
        return out.transpose(1, 2).flatten(2)  # [b, s, h * d]


def test_compiles_fullgraph_and_matches_eager() -> None:
    torch._dynamo.reset()
    model = _TinyAttention()
    x = torch.randn(2, 9, 32, requires_grad=True)
    positions = torch.arange(3, 12)
    eager = model(x, positions)
    compiled = torch.compile(model, fullgraph=True)
    got = compiled(x, positions)
    torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)
    (g_eager,) = torch.autograd.grad(eager.sum(), x)
    (g_comp,) = torch.autograd.grad(got.sum(), x)
    torch.testing.assert_close(g_comp, g_eager, rtol=1e-5, atol=1e-5)


def test_first_use_under_compile_fullgraph() -> None:
    # In a fresh process the kernel is found (built or loaded) while torch.compile traces the
    # first call: the availability checks must be constants to Dynamo, not traced code.
    import subprocess
    import sys

    code = (
        "import torch, torch._dynamo\n"
        "from posenc.kernels import rope_qk, rope_op\n"
        "assert torch.compiler.assume_constant_result(lambda: 0)._dynamo_marked_constant\n"
        "cos, sin = torch.ones(6, 8), torch.zeros(6, 8)\n"
        "f = torch.compile(lambda q, k: rope_qk(q, k, cos, sin), fullgraph=True)\n"
        "q = torch.randn(1, 2, 6, 16)\n"
        "out = f(q, q.clone())\n"
        "assert torch.equal(out[0], q)\n"
        "print(rope_op.select_backend('auto', q, (cos, sin)))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == ("cpu" if not CPU_REASON else "torch")


def test_inplace_compiles_fullgraph() -> None:
    torch._dynamo.reset()
    cos, sin = tables(6, 16)

    def f(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k = q * 2, k + 1
        rope_qk(q, k, cos, sin, inplace=True)
        return q, k

    q, k = torch.randn(1, 2, 6, 16), torch.randn(1, 1, 6, 16)
    got = torch.compile(f, fullgraph=True)(q, k)
    want = f(q, k)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.skipif(bool(CPU_REASON), reason="no CPU kernel here")
def test_cpu_kernel_bf16_equals_the_reference_bit_for_bit_incl_nan_inf() -> None:
    """The kernel's float32 math equals the reference's (no FMA), so the one rounding to bf16
    (nearest even; NaN stays NaN; inf stays inf) must give the same bits: whichever vector path
    the host compiles (AVX-512, AVX2, generic)."""
    g = torch.Generator().manual_seed(3)
    q = (
        torch.randn(2, 3, 37, 64, generator=g)
        * 10.0 ** torch.randint(-30, 30, (2, 3, 37, 1), generator=g)
    ).bfloat16()
    k = torch.randn(2, 1, 37, 64, generator=g).bfloat16()
    q[0, 0, 0, 5], q[0, 1, 2, 40], k[1, 0, 3, 0] = float("nan"), float("inf"), float("-inf")
    cos, sin = tables(40, 64)
    pos = torch.randint(0, 40, (2, 37), generator=g)
    for layout in ("half", "interleaved"):
        got = rope_qk(q, k, cos, sin, positions=pos, layout=layout, backend="cpu")
        want = rope_qk(q, k, cos, sin, positions=pos, layout=layout, backend="torch")
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16)) or torch.equal(
                torch.nan_to_num(a.float(), nan=7.0), torch.nan_to_num(b.float(), nan=7.0)
            )
