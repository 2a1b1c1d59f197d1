"""Position inputs on the wrong device, of the wrong dtype or shape: a one-line error at every
public entry (never a crash in a kernel), and ``inplace=True`` under autograd on views.

The "other device" here is ``meta``, the one every machine has: the CPU kernel handed a meta
tensor's (null) data pointer used to end the process (SIGSEGV, exit 139); the reported call is
rerun in a subprocess, where a crash fails one test instead of ending the session.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch

from posenc.absolute import LearnedEncoding, SinusoidalEncoding
from posenc.attention import Attention
from posenc.bias import FIRE, KERPLE, ALiBi, Sandwich, T5RelativeBias
from posenc.kernels import available_backends, rope_qk
from posenc.model import ModelConfig, TransformerLM
from posenc.relative import CoPE, DeBERTaRelative, ShawRelative, TransformerXLRelative
from posenc.rotary import (
    Axial2DRoPE,
    DecoupledRoPE,
    MRoPE,
    QueryTemperature,
    RotaryEmbedding,
    XPos,
)

B, H, S, D = 2, 2, 6, 8
BACKENDS = [b for b in ("cpu", "torch", "triton") if b in available_backends("cpu")]

META = torch.arange(S, device="meta")
FLOAT = torch.arange(S, dtype=torch.float32)
LONGER = torch.arange(S + 1)  # one position too many
CUBE = torch.zeros(1, 1, S, dtype=torch.long)  # 3-D where [s] or [b, s] is expected
BAD = {"device": META, "dtype": FLOAT, "length": LONGER, "rank": CUBE}
# What each error must name (besides the argument).
SAYS = {"device": "device", "dtype": "dtype", "length": "", "rank": ""}


def qk() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(B, H, S, D, generator=g), torch.randn(B, H, S, D, generator=g)


def tables() -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.arange(16)[:, None] * torch.rand(D // 2)  # [16, d/2]
    return angles.cos(), angles.sin()


def _rope_qk(backend: str, **kw: torch.Tensor) -> Callable[[torch.Tensor], object]:
    q, k = qk()
    cos, sin = tables()

    def call(bad: torch.Tensor) -> object:
        args = {name: bad if value is None else value for name, value in kw.items()}
        return rope_qk(q, k, cos, sin, backend=backend, **args)

    return call


def _module(enc: torch.nn.Module, k_side: bool = False) -> Callable[[torch.Tensor], object]:
    q, k = qk()
    good = torch.arange(S)

    def call(bad: torch.Tensor) -> object:
        return enc(q, k, good, bad) if k_side else enc(q, k, bad)

    return call


def _bias(enc: torch.nn.Module, method: str, k_side: bool) -> Callable[[torch.Tensor], object]:
    good = torch.arange(S)

    def call(bad: torch.Tensor) -> object:
        f = getattr(enc, method)
        return f(good, bad) if k_side else f(bad, good)

    return call


def _relative(enc: torch.nn.Module, k_side: bool) -> Callable[[torch.Tensor], object]:
    q, k = qk()

    def call(bad: torch.Tensor) -> object:
        pos = {"positions": torch.arange(S), "k_positions": torch.arange(S)}
        pos["k_positions" if k_side else "positions"] = bad
        return enc.attend(q, k, k.clone(), **pos)

    return call


def _absolute(enc: torch.nn.Module) -> Callable[[torch.Tensor], object]:
    x = torch.randn(B, S, 32)
    return lambda bad: enc(x, bad)


def _attention(encoding: torch.nn.Module | None) -> Callable[[torch.Tensor], object]:
    attn = Attention(32, 4, encoding=encoding)
    x = torch.randn(B, S, 32)
    return lambda bad: attn(x, bad)


def _temperature() -> Callable[[torch.Tensor], object]:
    q, _ = qk()
    t = QueryTemperature("llama4_scaling", 0.1, 4)
    return lambda bad: t(q, bad)


def _model() -> Callable[[torch.Tensor], object]:
    model = TransformerLM(ModelConfig(vocab_size=16, dim=32, num_heads=4, num_layers=1))
    tokens = torch.zeros(B, S, dtype=torch.long)
    return lambda bad: model(tokens, bad)


def entries() -> dict[str, Callable[[], Callable[[torch.Tensor], object]]]:
    """Every public entry that takes positions, as ``name -> factory of call(bad)``."""
    out: dict[str, Callable[[], Callable[[torch.Tensor], object]]] = {}
    for b in BACKENDS:
        out[f"rope_qk[{b}] positions"] = lambda b=b: _rope_qk(b, positions=None)
        out[f"rope_qk[{b}] k_positions"] = lambda b=b: _rope_qk(
            b, positions=torch.arange(S), k_positions=None
        )
        rope = RotaryEmbedding(D, backend=b)
        out[f"RotaryEmbedding[{b}] positions"] = lambda r=rope: _module(r)
        out[f"RotaryEmbedding[{b}] k_positions"] = lambda r=rope: _module(r, True)
    out["MRoPE positions"] = lambda: _module(MRoPE(D, [2, 1, 1]))
    out["MRoPE k_positions"] = lambda: _module(MRoPE(D, [2, 1, 1]), True)
    out["XPos positions"] = lambda: _module(XPos(D))
    out["Axial2DRoPE positions"] = lambda: _module(Axial2DRoPE(D, (2, 3)))
    out["DecoupledRoPE positions"] = lambda: _module(DecoupledRoPE(4, 4))
    out["QueryTemperature positions"] = _temperature
    for enc in (ALiBi(H), T5RelativeBias(H), KERPLE(H), FIRE(H), Sandwich(H)):
        for method in ("bias", "score_mod"):
            for side in (False, True):
                name = f"{type(enc).__name__}.{method} {'k_positions' if side else 'positions'}"
                out[name] = lambda e=enc, m=method, k=side: _bias(e, m, k)
    relatives = (
        ShawRelative(D),
        TransformerXLRelative(16, H),
        DeBERTaRelative(16, H, share_att_key=False),
        CoPE(D, H),
    )
    for enc in relatives:
        for side in (False, True):
            name = f"{type(enc).__name__}.attend {'k_positions' if side else 'positions'}"
            out[name] = lambda e=enc, k=side: _relative(e, k)
    out["SinusoidalEncoding positions"] = lambda: _absolute(SinusoidalEncoding(32))
    out["LearnedEncoding positions"] = lambda: _absolute(LearnedEncoding(16, 32))
    out["Attention(rope) positions"] = lambda: _attention(RotaryEmbedding(8))
    out["Attention(alibi) positions"] = lambda: _attention(ALiBi(4))
    out["Attention(shaw) positions"] = lambda: _attention(ShawRelative(8))
    out["Attention(none) positions"] = lambda: _attention(None)
    out["TransformerLM positions"] = _model
    return out


ENTRIES = entries()


@pytest.mark.parametrize("kind", list(BAD))
@pytest.mark.parametrize("entry", list(ENTRIES))
def test_bad_positions_raise_one_line_errors(entry: str, kind: str) -> None:
    call = ENTRIES[entry]()
    bad = BAD[kind]
    if kind == "rank" and entry.startswith("MRoPE"):
        bad = torch.zeros(2, B, S, dtype=torch.long)  # 3-D but not [3, b, s]
    if kind == "length" and (".bias" in entry or ".score_mod" in entry):
        pytest.skip("a bias takes s query and t key positions of any lengths: none is wrong")
    if kind == "length" and "Axial" in entry:
        bad = torch.arange(S + 1)
    with pytest.raises((ValueError, TypeError)) as info:
        call(bad)
    message = str(info.value)
    assert "\n" not in message, message
    assert "positions" in message, message
    assert SAYS[kind] in message, message


def test_bad_positions_with_kv_cache_and_memory() -> None:
    attn = Attention(32, 4, encoding=TransformerXLRelative(32, 4))
    x, memory = torch.randn(B, S, 32), torch.randn(B, 3, 32)
    with pytest.raises(ValueError, match="memory_positions must be on the device of x"):
        attn(x, memory=memory, memory_positions=torch.arange(3, device="meta"))
    with pytest.raises(ValueError, match="memory must be on the device of x"):
        attn(x, memory=memory.to("meta"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_tables_and_cu_seqlens(backend: str) -> None:
    q, k = qk()
    cos, sin = tables()
    with pytest.raises(ValueError, match=r"^cos must be on the device of q \(cpu\), got meta$"):
        rope_qk(q, k, cos.to("meta"), sin, backend=backend, positions=torch.arange(S))
    with pytest.raises(ValueError, match="sin_k must be on the device of q"):
        rope_qk(q, k, cos[:S], sin[:S], cos_k=cos[:S], sin_k=sin[:S].to("meta"), backend=backend)
    packed_q, packed_k = q[0].transpose(0, 1), k[0].transpose(0, 1)  # [total, h, d]
    cu = torch.tensor([0, 2, S])
    with pytest.raises(ValueError, match="cu_seqlens must be on the device of q"):
        rope_qk(packed_q, packed_k, cos, sin, cu_seqlens=cu.to("meta"), backend=backend)
    with pytest.raises(TypeError, match="cu_seqlens must be a 1-D int32/int64 tensor"):
        rope_qk(packed_q, packed_k, cos, sin, cu_seqlens=cu.float(), backend=backend)
    with pytest.raises(ValueError, match=r"cu_seqlens must be 1-D \[num_seqs \+ 1\]"):
        rope_qk(packed_q, packed_k, cos, sin, cu_seqlens=cu[None], backend=backend)
    want = rope_qk(packed_q, packed_k, cos, sin, cu_seqlens=cu, backend="torch")
    got = rope_qk(packed_q, packed_k, cos, sin, cu_seqlens=cu, backend=backend)
    torch.testing.assert_close(got, want)


def test_q_and_k_on_two_devices() -> None:
    q, k = qk()
    with pytest.raises(ValueError, match="q and k must be on one device"):
        RotaryEmbedding(D)(q, k.to("meta"))


def test_meta_inputs_compute_shapes() -> None:
    """Meta q, k and positions together are allowed: shape inference, no kernel runs."""
    q, k = (t.to("meta") for t in qk())
    out = RotaryEmbedding(D)(q, k, torch.arange(S, device="meta"))
    assert out[0].device.type == "meta" and out[0].shape == q.shape


def test_uint8_and_int16_positions_index_rows_not_masks() -> None:
    """A uint8 index tensor is a mask to torch; int16 no index at all: both are converted."""
    x = torch.randn(1, 4, 8)
    for enc in (SinusoidalEncoding(8), LearnedEncoding(16, 8)):
        want = enc(x, torch.arange(4))
        for dtype in (torch.uint8, torch.int16, torch.int32):
            assert torch.equal(enc(x, torch.arange(4, dtype=dtype)), want)


def test_the_old_segfault_is_an_error_in_a_fresh_process() -> None:
    """The reported crash, exactly: exit 139 before, a ValueError now."""
    code = (
        "import torch\n"
        "from posenc.rotary import RotaryEmbedding\n"
        "q = torch.randn(1, 2, 6, 8)\n"
        "try:\n"
        "    RotaryEmbedding(8)(q, q.clone(), torch.arange(6, device='meta'))\n"
        "except ValueError as e:\n"
        "    print(e)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert res.returncode == 0, (res.returncode, res.stderr[-2000:])
    assert res.stdout.strip() == "positions must be on the device of q (cpu), got meta"


# --- inplace=True under autograd -----------------------------------------------------------------


def _views(form: str, base: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """q and k as views of one tensor: ``bshd`` transposes or slices of a packed qkv."""
    if form == "bshd":
        x = base * 1.0  # [b, s, 2h, d], non-leaf
        return x[:, :, :H], x[:, :, H:], {"seq_layout": "bshd"}
    x = base * 1.0  # [b, s, 3, h, d]: packed qkv
    q = x[:, :, 0].transpose(1, 2)  # [b, h, s, d], a strided view
    k = x[:, :, 1].transpose(1, 2)
    return q, k, {}


@pytest.mark.parametrize("form", ["bshd", "qkv"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_inplace_on_views_with_gradients(backend: str, form: str) -> None:
    cos, sin = tables()
    shape = (B, S, 2 * H, D) if form == "bshd" else (B, S, 3, H, D)
    base = torch.randn(*shape, dtype=torch.float64 if backend == "torch" else torch.float32)
    grads = []
    for inplace in (False, True):
        leaf = base.clone().requires_grad_()
        q, k, kw = _views(form, leaf)
        q_rot, k_rot = rope_qk(
            q, k, cos, sin, positions=torch.arange(S), inplace=inplace, backend=backend, **kw
        )
        if inplace:
            assert q_rot is q and k_rot is k
        loss = (q_rot * torch.linspace(-1, 1, D)).sum() + (k_rot**2).sum()
        (g,) = torch.autograd.grad(loss, leaf)
        grads.append((g, q_rot.detach().clone(), k_rot.detach().clone()))
    (g0, q0, k0), (g1, q1, k1) = grads
    torch.testing.assert_close(q1, q0, rtol=0, atol=0)
    torch.testing.assert_close(k1, k0, rtol=0, atol=0)
    torch.testing.assert_close(g1, g0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_inplace_into_a_leaf_fails_before_writing(backend: str) -> None:
    cos, sin = tables()
    q = torch.randn(B, H, S, D)
    k = torch.randn(B, H, S, D, requires_grad=True)  # a leaf that requires grad
    q_before = q.clone()
    with pytest.raises(ValueError, match="inplace=True cannot write into k: it is a leaf"):
        rope_qk(q, k, cos[:S], sin[:S], inplace=True, backend=backend)
    assert torch.equal(q, q_before)  # q untouched: the check came first
    view = torch.randn(B, S, H, D, requires_grad=True)
    with pytest.raises(ValueError, match="it is a view of a leaf tensor"):
        rope_qk(view.transpose(1, 2), q, cos[:S], sin[:S], inplace=True, backend=backend)
    with torch.no_grad():  # no autograd, no restriction
        rope_qk(q, k, cos[:S], sin[:S], inplace=True, backend=backend)
