"""The decode fast path: a call layout checked once runs from its plan, and stays exact and
checked where a check reads values.

References: transformers' own ``apply_rotary_pos_emb`` and posenc's pure-PyTorch reference
(``backend="torch"``, which never makes a plan).
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply

from posenc.hf import apply_rotary_pos_emb
from posenc.hf import rotary as hf_rotary
from posenc.kernels import canonical, cpu_rope, rope_op, rope_qk
from posenc.kernels.backends import available_backends
from posenc.rotary import RotaryEmbedding

pytestmark = pytest.mark.skipif(
    "cpu" not in available_backends("cpu"), reason="the CPU kernel is not available here"
)


def _qk(b: int = 2, dtype: torch.dtype = torch.float32, s: int = 1, d: int = 16):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, 4, s, d, generator=g).to(dtype)  # [b, h, s, d]
    k = torch.randn(b, 2, s, d, generator=g).to(dtype)  # [b, hk, s, d]
    return q, k


def _table(n: int = 64, d: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = torch.arange(n, dtype=torch.float64)[:, None] * inv  # [n, d/2]
    return angle.cos().float(), angle.sin().float()


def _count(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[int]:
    calls = [0]
    real = getattr(module, name)

    def counted(*args: object, **kw: object) -> object:
        calls[0] += 1
        return real(*args, **kw)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_a_layout_seen_before_skips_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count(monkeypatch, rope_op, "canonicalize")
    cos, sin = _table()
    q, k = _qk()
    for p in (3, 40, 63):  # a decode loop: new positions, one layout
        pos = torch.full((2, 1), p)
        got = rope_qk(q, k, cos, sin, positions=pos)
        want = rope_qk(q, k, cos, sin, positions=pos, backend="torch")
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    # One checked call for the kernel's layout; the reference calls are checked every time.
    assert calls[0] == 1 + 3


@pytest.mark.parametrize("bad", [64, -1])
def test_a_planned_layout_still_checks_the_positions(bad: int) -> None:
    cos, sin = _table()
    q, k = _qk()
    rope_qk(q, k, cos, sin, positions=torch.full((2, 1), 5))  # makes the plan
    with pytest.raises(ValueError, match=r"positions must index the table's 64 rows, got values"):
        rope_qk(q, k, cos, sin, positions=torch.full((2, 1), bad))


def test_a_planned_in_place_layout_still_refuses_shared_memory() -> None:
    cos, sin = _table(1)
    q, k = _qk(b=1)
    kk = torch.randn(1, 4, 1, 16)  # k of q's shape: one buffer can then be passed as both
    rope_qk(q, kk, cos, sin, inplace=True)
    with pytest.raises(ValueError, match="separate memory"):
        rope_qk(q, q, cos, sin, inplace=True)
    del k


def test_a_head_dim_with_a_non_unit_stride_is_rotated_right() -> None:
    # The eager CPU path launched the kernel on such a view directly (it reads d with stride 1).
    cos, sin = _table(3)
    q = torch.randn(1, 4, 3, 32)[..., ::2]  # [1, 4, 3, 16], strides (.., 2)
    k = torch.randn(1, 2, 3, 16)
    got = rope_qk(q, k, cos, sin)
    want = rope_qk(q, k, cos, sin, backend="torch")
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_every_layout_form_runs_its_plan_exactly() -> None:
    cos, sin = _table()
    for seq_layout in ("bhsd", "bshd"):
        for s in (1, 5):
            q, k = _qk(s=s)
            if seq_layout == "bshd":
                q, k = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
            pos = torch.arange(10, 10 + s)
            want = rope_qk(q, k, cos, sin, positions=pos, seq_layout=seq_layout, backend="torch")
            checked = rope_qk(q, k, cos, sin, positions=pos, seq_layout=seq_layout)
            planned = rope_qk(q, k, cos, sin, positions=pos, seq_layout=seq_layout)
            for got in (checked, planned):
                torch.testing.assert_close(got, want, rtol=0, atol=0)
            # The plan returns the checked path's layout.
            assert [t.stride() for t in planned] == [t.stride() for t in checked]


def test_no_plan_under_grad_or_for_a_copied_input() -> None:
    cos, sin = _table()
    q, k = _qk()
    before = len(rope_op._PLANS)
    rope_qk(q.requires_grad_(), k, cos, sin, positions=torch.full((2, 1), 1))
    rope_qk(q.detach(), k, cos, sin, positions=torch.full((2, 1), 1, dtype=torch.int32))
    assert len(rope_op._PLANS) == before


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_drop_in_reads_transformers_tables_as_they_are(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    calls = _count(monkeypatch, hf_rotary, "half_tables")
    cos, sin = _table()
    q, k = _qk(dtype=dtype, d=16)
    for p in (7, 8, 9):
        c, s = cos[[p]], sin[[p]]  # [1, n]
        cos_hf = torch.cat((c, c), -1)[None].to(dtype)  # [1, 1, d]: transformers' form
        sin_hf = torch.cat((s, s), -1)[None].to(dtype)
        for _layer in range(3):  # the layers of one step share the tables
            got = apply_rotary_pos_emb(q, k, cos_hf, sin_hf)
            want = hf_apply(q.float(), k.float(), cos_hf.float(), sin_hf.float())
            torch.testing.assert_close(got[0].float(), want[0].to(dtype).float())
    # float32: the checked first call alone; bfloat16: that call, then once per step's table
    # pair (the memo serves the other layers).
    assert calls[0] == (1 if dtype == torch.float32 else 1 + 3)


def test_the_drop_in_memo_sees_an_in_place_write() -> None:
    q, k = _qk(dtype=torch.bfloat16)
    cos_hf = torch.ones(1, 1, 16, dtype=torch.bfloat16)
    sin_hf = torch.zeros(1, 1, 16, dtype=torch.bfloat16)
    apply_rotary_pos_emb(q, k, cos_hf, sin_hf)
    torch.testing.assert_close(apply_rotary_pos_emb(q, k, cos_hf, sin_hf)[0], q)
    cos_hf.neg_()  # a rotation by pi: the same objects, new values
    torch.testing.assert_close(apply_rotary_pos_emb(q, k, cos_hf, sin_hf)[0], -q)


def test_the_module_plan_is_exact_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    rope = RotaryEmbedding(16, cache_len=64)
    ref = RotaryEmbedding(16, cache_len=64, backend="torch")
    calls = _count(monkeypatch, RotaryEmbedding, "tables")
    q, k = _qk()
    for p in (5, 6, 100):  # 100: past the cached table, the checked path
        pos = torch.full((2, 1), p)
        torch.testing.assert_close(rope(q, k, pos), ref(q, k, pos), rtol=0, atol=0)
    assert calls[0] == 1 + 3 + 1  # rope: 5 checked, 6 planned, 100 checked; ref: every call
    with pytest.raises(ValueError, match="positions must be non-negative, got minimum -1"):
        rope(q, k, torch.full((2, 1), -1))


def test_a_planned_module_copies() -> None:
    rope = RotaryEmbedding(16)
    q, k = _qk()
    pos = torch.full((2, 1), 3)
    rope(q, k, pos)
    assert rope._plans
    other = copy.deepcopy(rope)  # a copy starts with no plan and makes its own
    assert not other._plans and type(other._plans) is rope_op.Plans
    torch.testing.assert_close(other(q, k, pos), rope(q, k, pos), rtol=0, atol=0)
    assert other._plans
    torch.testing.assert_close(other(q, k, pos), rope(q, k, pos), rtol=0, atol=0)  # planned
    plan = next(iter(rope._plans.values()))
    assert pickle.loads(pickle.dumps(plan.call))._fixed_q == plan.call._fixed_q
    with pytest.raises(ValueError, match="prepared by another version"):
        cpu_rope._cpu_call(plan.call._fixed_q[:-8], plan.call._fixed_k, False)


def test_the_plan_key_changes_with_every_checked_property() -> None:
    q, k = _qk()
    cos, sin = _table()
    base = canonical.call_key((q, k, cos, sin, None, None, None, None), "auto")
    changed = [
        canonical.call_key((q.double(), k, cos, sin, None, None, None, None), "auto"),
        canonical.call_key((q.transpose(1, 2), k, cos, sin, None, None, None, None), "auto"),
        canonical.call_key((q[:1], k, cos, sin, None, None, None, None), "auto"),
        canonical.call_key((q, k, cos.requires_grad_(), sin, None, None, None, None), "auto"),
        canonical.call_key((q, k, cos, sin, None, None, None, None), "torch"),
        canonical.call_key((q, k, cos, sin, None, None, torch.zeros(1, dtype=torch.long), None)),
    ]
    assert all(c != base for c in changed)
    assert canonical.call_key(([1], k, cos, sin, None, None, None, None)) is None


def test_k_own_table_through_q_positions_is_planned_and_checked() -> None:
    # xPos's form: k has its own table but reads q's positions (one object for both).
    cos, sin = _table()
    cos_k, sin_k = cos[:32] * 0.5, sin[:32] * 0.5  # k's table: fewer rows, other values
    q, k = _qk()
    before = len(rope_op._PLANS)
    for p in (3, 20, 31):
        pos = torch.full((2, 1), p)
        kw = {"cos_k": cos_k, "sin_k": sin_k, "positions": pos, "k_positions": pos}
        got = rope_qk(q, k, cos, sin, **kw)
        torch.testing.assert_close(
            got, rope_qk(q, k, cos, sin, **kw, backend="torch"), rtol=0, atol=0
        )
    assert len(rope_op._PLANS) == before + 1
    pos = torch.full((2, 1), 40)  # inside q's 64 rows, past k's 32: the planned call says so
    with pytest.raises(ValueError, match=r"k_positions must index the table's 32 rows"):
        rope_qk(q, k, cos, sin, cos_k=cos_k, sin_k=sin_k, positions=pos, k_positions=pos)


@pytest.mark.parametrize("allocation", [False, True, "hw_alternating"])
def test_mrope_text_positions_run_a_plan_exactly(
    monkeypatch: pytest.MonkeyPatch, allocation: bool | str
) -> None:
    from posenc.rotary import MRoPE

    sections = {False: [2, 3, 3], True: [4, 2, 2], "hw_alternating": [3, 3, 2]}[allocation]
    mrope = MRoPE(16, sections, interleaved=allocation)
    calls = _count(monkeypatch, MRoPE, "tables")
    q, k = _qk()
    for p in (5, 6, 7, 5000):  # 5000: past the 4096-row table, the checked path
        pos = torch.full((2, 1), p)
        got = mrope(q, k, pos)
        # The reference: M-RoPE's own [3, b, s] path, every axis at the text position.
        want = mrope(q, k, pos[None].expand(3, 2, 1))
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    # 5 checked (and its plan made); 6, 7 planned; 5000 checked; the [3, b, s] calls: 4.
    assert calls[0] == 1 + 1 + 4
    with pytest.raises(ValueError, match="positions must be non-negative, got minimum -1"):
        mrope(q, k, torch.full((2, 1), -1))


def test_xpos_decode_steps_run_a_plan_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    from posenc.functional import apply_rotary_qk
    from posenc.rotary import XPos

    xpos = XPos(16)
    calls = _count(monkeypatch, XPos, "tables")
    q, k = _qk()
    for p in (5, 6, 7, 4096):  # 4096: past the cached tables, the checked path
        pos = torch.full((2, 1), p)
        got = xpos(q, k, pos)
        # The reference: the scaled cos/sin of these positions, rotated by the torch backend.
        (cq, sq), (ck, sk) = xpos.cos_sin(pos), xpos.cos_sin(pos, downscale=True)
        want = apply_rotary_qk(q, k, cq, sq, ck, sk, "interleaved", backend="torch")
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert calls[0] == 1 + 1  # 5 checked, 6 and 7 planned, 4096 checked
    with pytest.raises(ValueError, match="positions must be non-negative, got minimum -1"):
        xpos(q, k, torch.full((2, 1), -1))


def test_xpos_tables_stop_at_the_dtype_limit() -> None:
    from posenc.rotary import XPos

    xpos = XPos(16)
    limit = xpos.max_offset(torch.float16)  # 2832: the cached rows stop there for float16
    q, k = _qk(dtype=torch.float16)
    xpos(q, k, torch.full((2, 1), limit))  # the last row; the plan is made
    xpos(q, k, torch.full((2, 1), limit))
    with pytest.raises(ValueError, match=f"positions must lie within {limit} of center=0"):
        xpos(q, k, torch.full((2, 1), limit + 1))


@pytest.mark.parametrize("rope_type", ["yarn", "dynamic"])
def test_a_planned_module_follows_its_frequency_set(rope_type: str) -> None:
    # yarn: one set, its table kept with the plan; dynamic NTK: past the original length the
    # frequencies grow with it (the checked path), and within it the base set serves.
    scaling = {"rope_type": rope_type, "factor": 2.0, "original_max_position_embeddings": 32}
    rope = RotaryEmbedding(16, scaling=scaling, cache_len=64)
    ref = RotaryEmbedding(16, scaling=scaling, cache_len=64, backend="torch")
    q, k = _qk()
    for p in (5, 6, 40, 41, 7, 63):
        pos = torch.full((2, 1), p)
        torch.testing.assert_close(rope(q, k, pos), ref(q, k, pos), rtol=0, atol=0)
    assert len(rope._plans) == 1


def test_a_subclass_of_mrope_with_its_own_step_gets_no_plan() -> None:
    from posenc.rotary import MRoPE

    class Doubled(MRoPE):
        def apply_tables(self, q, k, tables):  # type: ignore[no-untyped-def]
            q2, k2 = super().apply_tables(q, k, tables)
            return 2 * q2, 2 * k2

    mrope, doubled = MRoPE(16, [2, 3, 3]), Doubled(16, [2, 3, 3])
    q, k = _qk()
    pos = torch.full((2, 1), 5)
    for _ in range(3):  # the later calls would run a plan that skips apply_tables
        torch.testing.assert_close(doubled(q, k, pos)[0], 2 * mrope(q, k, pos)[0])
    assert doubled._plans is None


def test_mrope_makes_no_plan_where_none_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    from posenc.rotary import MRoPE

    mrope = MRoPE(16, [2, 3, 3])  # its table: 4096 rows, grown up to 2 ** 20
    calls = _count(monkeypatch, RotaryEmbedding, "tables")
    q, k = _qk()
    mrope(q.requires_grad_(), k, torch.full((2, 1), 5))  # gradients: no plan, no table
    mrope(q.detach(), k, torch.full((2, 1), 1 << 20))  # past the largest table
    assert calls[0] == 0 and not mrope._plans


def test_xpos_follows_a_changed_center_and_scale_base() -> None:
    from posenc.rotary import XPos

    xpos = XPos(16)
    q, k = _qk()
    pos = torch.full((2, 1), 7)
    xpos(q, k, pos), xpos(q, k, pos)  # planned
    xpos.center, xpos.scale_base = 3, 64.0
    torch.testing.assert_close(xpos(q, k, pos), XPos(16, scale_base=64.0, center=3)(q, k, pos))


def test_a_changed_cache_len_is_a_new_table() -> None:
    rope = RotaryEmbedding(16, cache_len=64)
    ref = RotaryEmbedding(16, cache_len=256, backend="torch")
    q, k = _qk()
    rope(q, k, torch.full((2, 1), 5)), rope(q, k, torch.full((2, 1), 5))  # planned, 64 rows
    rope.cache_len = 256
    pos = torch.full((2, 1), 200)  # past the old table: read from a new one, never past its end
    torch.testing.assert_close(rope(q, k, pos), ref(q, k, pos), rtol=0, atol=0)


def test_the_last_hit_memo_answers_as_the_dict_does() -> None:
    plans = rope_op.Plans()
    a, b = ("a", torch.Size([1, 2])), ("b", torch.Size([1, 2]))
    rope_op.remember(plans, a, "plan a")
    rope_op.remember(plans, b, "plan b")
    assert rope_op.lookup(plans, a) == (a, "plan a") and plans.last == (a, "plan a")
    # an equal key built again (new Size objects) hits the memo; another key does not
    assert rope_op.lookup(plans, ("a", torch.Size([1, 2])))[1] == "plan a"
    assert rope_op.lookup(plans, b)[1] == "plan b" and plans.last == (b, "plan b")
    rope_op.remember(plans, b, "plan b2")  # a new plan for the memo's key replaces it there too
    assert rope_op.lookup(plans, b)[1] == "plan b2"
    assert rope_op.lookup(plans, ("c",)) == (("c",), None)
    assert rope_op.lookup(plans, (["unhashable"],)) == (None, None)
    assert rope_op.lookup(plans, None) == (None, None)
    plans.clear()
    assert plans.last is None and rope_op.lookup(plans, b) == (b, None)
    # a plain dict (a module pickled before the memo existed) is looked up without one
    assert rope_op.lookup({a: "plan a"}, a) == (a, "plan a")


def test_a_module_with_a_memo_pickles_and_copies() -> None:
    rope = RotaryEmbedding(16)
    q, k = _qk()
    positions = torch.tensor([[3], [5]])
    want = rope(q, k, positions)
    rope(q, k, positions)
    assert rope._plans.last is not None
    for other in (copy.deepcopy(rope), pickle.loads(pickle.dumps(rope))):
        assert other._plans.last is None
        for _ in range(2):  # checked, then planned
            got = other(q, k, positions)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_a_planned_call_checks_every_batch_row_before_it_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The kernel checks a planned call's positions: each batch row's, and k's before q is
    # written (in place, a bad k must leave q as it was).
    cos, sin = _table()
    q, k = _qk(b=3, s=2)
    good = torch.tensor([[1, 2], [3, 4], [5, 6]])
    rope_qk(q.clone(), k.clone(), cos, sin, positions=good, k_positions=good.clone(), inplace=True)
    calls = _count(monkeypatch, rope_op, "canonicalize")
    for bad_row in range(3):
        bad = good.clone()
        bad[bad_row, 1] = 64
        qq, kk = q.clone(), k.clone()
        with pytest.raises(ValueError, match=r"k_positions must index the table's 64 rows"):
            rope_qk(qq, kk, cos, sin, positions=good, k_positions=bad, inplace=True)
        assert torch.equal(qq, q) and torch.equal(kk, k)
        with pytest.raises(ValueError, match=r"^positions must index the table's 64 rows"):
            rope_qk(qq, kk, cos, sin, positions=bad, k_positions=good, inplace=True)
        assert torch.equal(qq, q) and torch.equal(kk, k)
    assert calls[0] == 0  # every call above ran the plan
    got = rope_qk(q.clone(), k.clone(), cos, sin, positions=good, k_positions=good.clone(),
                  inplace=True)  # fmt: skip
    want = rope_qk(q, k, cos, sin, positions=good, k_positions=good, backend="torch")
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_lowered_cache_len_is_no_longer_read_from_the_old_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A lowered cache_len starts the table again (grown from the new cache_len to cover the
    # position), never read from the larger table a plan kept (which would also keep it alive).
    rope = RotaryEmbedding(16, cache_len=4096)
    ref = RotaryEmbedding(16, cache_len=64, backend="torch")
    q, k = _qk()
    rope(q, k, torch.full((2, 1), 5)), rope(q, k, torch.full((2, 1), 5))  # planned, 4096 rows
    rope.cache_len = 64
    calls = _count(monkeypatch, RotaryEmbedding, "tables")
    pos = torch.full((2, 1), 1000)
    torch.testing.assert_close(rope(q, k, pos), ref(q, k, pos), rtol=0, atol=0)
    assert calls[0] == 2  # rope's checked path (not its old plan), and ref's
