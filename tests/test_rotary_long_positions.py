"""Decoding far past the first cos/sin table: the table grows on demand and stays exact.

``RotaryEmbedding``'s table starts at ``cache_len`` rows and doubles to cover the positions of
an eager CPU call, up to ``max_cache_len``; past that a window table holds the call's positions;
for frequencies that change with the length (dynamic NTK past its original length), and a call
spanning more than a window, cos/sin are computed for the call. References:
the RoPE formula evaluated here in float64 (independently of posenc's helpers) and
transformers' own rotary modules and ``apply_rotary_pos_emb``. Speed is measured by
``posenc bench decode-positions``, never here.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from transformers.models.llama.configuration_llama import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply
from transformers.models.phi3.configuration_phi3 import Phi3Config
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

from posenc.hf import HFRotaryEmbedding, rope_from_hf
from posenc.kernels import rope_qk
from posenc.rotary import MRoPE, RotaryEmbedding, table_cache
from posenc.rotary.embedding import MAX_CACHE_LEN

D = 16  # 8 pairs: a 2**20-row table is 2 x 32 MiB
LONG = (4096, 4097, 10**5, 10**6, MAX_CACHE_LEN - 1)
PAST = (MAX_CACHE_LEN, 3 * 10**6)  # past the largest table: a window


def _qk(b: int = 2, d: int = D, dtype: torch.dtype = torch.float32, t: int = 1):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, 4, 1, d, generator=g).to(dtype)  # [b, h, 1, d]
    k = torch.randn(b, 2, t, d, generator=g).to(dtype)  # [b, hk, t, d]
    return q, k


def _formula(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """NeoX RoPE in float64: pairs ``(x[i], x[i + d/2])`` rotated by ``p * base**(-2i/d)``.

    ``x [b, h, 1, d]``, ``positions [b, 1]`` -> float64 ``[b, h, 1, d]``."""
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # [d/2]
    angle = positions.double()[:, None, :, None] * inv  # [b, 1, 1, d/2]
    x = x.double()
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat((x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()), -1)


def _close(got: tuple[torch.Tensor, torch.Tensor], q, k, positions, k_positions=None) -> None:  # type: ignore[no-untyped-def]
    # float32 outputs of |x| <= ~4: cos/sin rounded to float32, then two products and a sum
    k_positions = positions if k_positions is None else k_positions
    for out, x, p in zip(got, (q, k), (positions, k_positions), strict=True):
        torch.testing.assert_close(out.double(), _formula(x, p), rtol=0, atol=2e-6)


def _cos_sin_close(rope: RotaryEmbedding, positions: torch.Tensor) -> None:
    cos, sin = rope.cos_sin(positions)  # [*, d/2]
    angle = positions.double()[..., None] * 10000.0 ** (-torch.arange(0, D, 2).double() / D)
    torch.testing.assert_close(cos.double(), angle.cos(), rtol=0, atol=1e-7)
    torch.testing.assert_close(sin.double(), angle.sin(), rtol=0, atol=1e-7)


def _rows(rope: RotaryEmbedding, key: str = "base") -> int:
    entry = rope._tables.get((torch.device("cpu"), key))
    return 0 if entry is None else entry[0].shape[1]


@pytest.mark.parametrize("p", LONG + PAST)
def test_a_position_past_the_first_table_is_exact(p: int) -> None:
    rope = RotaryEmbedding(D)
    q, k = _qk()
    positions = torch.tensor([[p], [p - 1]])  # [b, 1]: a row per sequence
    _close(rope(q, k, positions), q, k, positions)
    if p < MAX_CACHE_LEN:  # the table grew by doubling from 4096 rows to cover it
        assert _rows(rope) == 4096 * 2 ** max(0, (p // 4096).bit_length())
    else:  # past the largest table: a window holds it, no table is built for it
        assert _rows(rope) == 0 and len(rope._windows.tables) == 1
    _cos_sin_close(rope, positions)  # what the drop-in reads: the same table


def test_a_decode_across_growths_is_exact_and_keeps_the_rows_it_had() -> None:
    # One module decoding as a long context does: positions jump past the table, come back,
    # and the planned calls between growths read the current table, never an old one.
    rope = RotaryEmbedding(D, cache_len=64)
    q, k = _qk()
    before = rope.cos_sin(torch.arange(64))  # [64, d/2] from the first table
    for p in (5, 6, 63, 64, 65, 5, 1000, 7, 10**5, 10**5 + 1, 3, 10**6, 2 * 10**6, 9, 10**6 + 1):
        positions = torch.full((2, 1), p)
        for _ in range(2):  # checked (or growing), then planned
            _close(rope(q, k, positions), q, k, positions)
    assert _rows(rope) == 64 * 2**14  # 1,048,576: grown five times, never for 2e6
    after = rope.cos_sin(torch.arange(64))
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])


def test_a_decode_past_the_largest_table_moves_a_window_and_stays_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rope = RotaryEmbedding(D, cache_len=64, max_cache_len=256)  # small limits: a cheap test
    serve = table_cache.Windows.serve
    served: list[int] = []  # the checked calls a window served (the window's start)

    def counted(self: table_cache.Windows, *args: Any) -> Any:
        out = serve(self, *args)
        if out is not None:
            served.append(next(iter(self.tables.values()))[2])
        return out

    monkeypatch.setattr(table_cache.Windows, "serve", counted)
    q, k = _qk()
    step = table_cache.WINDOW_STEP
    sequence = (255, 256, 257, step - 1, step, 2 * step - 1, 2 * step, 300, 10**7, 10**7 + 1)
    for p in sequence:
        positions = torch.full((2, 1), p)
        for _ in range(3):  # the table's plan, the window's (checked, then planned)
            _close(rope(q, k, positions), q, k, positions)
    assert _rows(rope) == 256
    # one checked call per window: positions 0 .. 2 step - 1, then 2 step .., 0 .. again, 1e7's
    assert served == [0, 2 * step, 0, 10**7 // step * step]
    _cos_sin_close(rope, torch.tensor([[10**7 + 5]]))  # the drop-in's call: a window too
    with pytest.raises(ValueError, match="positions must be non-negative, got minimum -1"):
        rope(q, k, torch.full((2, 1), -1))  # after the windowed calls: still checked


def test_a_window_serves_a_kv_cache_step_and_wide_calls_are_computed() -> None:
    rope = RotaryEmbedding(D)
    q, k = _qk(t=4)  # one query against four keys, as a KV-cache step with new keys
    for p in (10**5, 2 * 10**6, 2 * 10**6 + 1):
        positions = torch.full((2, 1), p)
        k_positions = torch.arange(p - 3, p + 1).expand(2, 4)  # [b, t]
        for _ in range(2):
            _close(rope(q, k, positions, k_positions), q, k, positions, k_positions)
    q, k = _qk()
    for span in (table_cache.WINDOW_STEP, table_cache.WINDOW_ROWS):  # in no window
        wide = torch.tensor([[2 * 10**6], [2 * 10**6 + span]])
        _close(rope(q, k, wide), q, k, wide)
        _cos_sin_close(rope, wide)


def test_a_grown_table_extends_the_old_one_row_for_row() -> None:
    rope = RotaryEmbedding(D, cache_len=100)
    cos_a, sin_a = rope._table(torch.device("cpu"), "base", 99)  # type: ignore[misc]
    cos_b, sin_b = rope._table(torch.device("cpu"), "base", 1000)  # type: ignore[misc]
    assert cos_a.shape[1] == 100 and cos_b.shape[1] == 1600  # 100 doubled four times
    assert torch.equal(cos_b[:, :100], cos_a) and torch.equal(sin_b[:, :100], sin_a)
    fresh = RotaryEmbedding(D, cache_len=1600)  # built at once
    cos_f, sin_f = fresh._table(torch.device("cpu"), "base", 1599)  # type: ignore[misc]
    torch.testing.assert_close(cos_b, cos_f, rtol=0, atol=0)
    torch.testing.assert_close(sin_b, sin_f, rtol=0, atol=0)


def test_max_cache_len_bounds_the_table() -> None:
    rope = RotaryEmbedding(D, cache_len=64, max_cache_len=256)
    q, k = _qk()
    for p, rows in ((200, 256), (300, 256), (10**6, 256)):  # past 256: computed per call
        positions = torch.full((2, 1), p)
        _close(rope(q, k, positions), q, k, positions)
        assert _rows(rope) == rows
    fixed = RotaryEmbedding(D, max_cache_len=1)  # max(cache_len, max_cache_len): 4096 rows
    positions = torch.full((2, 1), 5000)
    _close(fixed(q, k, positions), q, k, positions)
    assert _rows(fixed) == 0 and fixed.with_scaling(None).max_cache_len == 1
    with pytest.raises(ValueError, match=rf"max_cache_len must be <= {MAX_CACHE_LEN} "):
        RotaryEmbedding(D, max_cache_len=MAX_CACHE_LEN + 1)


def test_a_copy_starts_without_the_grown_table() -> None:
    rope = RotaryEmbedding(D)
    q, k = _qk()
    positions = torch.full((2, 1), 10**5)
    want = rope(q, k, positions)
    assert _rows(rope) == 131072
    rope(q, k, torch.full((2, 1), 3 * 10**6))  # and a window
    other = copy.deepcopy(rope)
    assert not other._tables and not other._windows.tables and not other._windows.plans
    got = other(q, k, positions)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_mrope_text_positions_decode_past_the_first_table() -> None:
    mrope = MRoPE(D, [2, 3, 3])  # text positions: the same angles on every axis, plain RoPE
    q, k = _qk()
    for p in (10**5, 10**5 + 1, 10**6):
        positions = torch.full((2, 1), p)
        for _ in range(2):
            _close(mrope(q, k, positions), q, k, positions)


def test_rope_qk_gathers_rows_of_a_long_table() -> None:
    # rope_qk serves any position its caller's table has a row for.
    rows = 10**6 + 2
    inv = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    angle = torch.arange(rows, dtype=torch.float64)[:, None] * inv  # [rows, d/2]
    cos, sin = angle.cos().float(), angle.sin().float()
    q, k = _qk()
    positions = torch.tensor([[10**6 + 1], [10**5]])
    for _ in range(2):  # checked, then planned
        _close(rope_qk(q, k, cos, sin, positions=positions), q, k, positions)


# --- against transformers: float32 angles (rope_from_hf), length-dependent frequencies ---------

HEADS = {"hidden_size": 4 * D, "num_attention_heads": 4, "num_key_value_heads": 2}
SCALINGS: dict[str, tuple[type, type, dict[str, Any]]] = {
    "default": (LlamaConfig, LlamaRotaryEmbedding, {"max_position_embeddings": 4096}),
    "yarn": (LlamaConfig, LlamaRotaryEmbedding, {
        "max_position_embeddings": 4 * 4096,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                         "original_max_position_embeddings": 4096}}),
    # frequencies of the call's length past 4096: computed for each call, never a table
    "dynamic": (LlamaConfig, LlamaRotaryEmbedding, {
        "max_position_embeddings": 4096,
        "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}),
    # short factors up to 4096, long ones past it: two tables, each grown for its own set
    "longrope": (Phi3Config, Phi3RotaryEmbedding, {
        "max_position_embeddings": 8 * 4096, "original_max_position_embeddings": 4096,
        "rope_scaling": {"type": "longrope",
                         "short_factor": [1.0 + i / 8 for i in range(D // 2)],
                         "long_factor": [2.0 + i for i in range(D // 2)]}}),
}  # fmt: skip
# Short and long sets alternate; the longest lengths come before short ones again.
SEQUENCE = (100, 4095, 4096, 10**5, 100, 10**6, 4000, 10**6 + 1, 3 * 10**6, 3 * 10**6 + 1)


@pytest.mark.parametrize("name", list(SCALINGS))
def test_long_positions_match_transformers(name: str) -> None:
    config_cls, rotary_cls, kw = SCALINGS[name]
    config = config_cls(**HEADS, **kw)
    rope, drop_in = rope_from_hf(config), HFRotaryEmbedding(config)
    q, k = _qk()
    x = torch.zeros(1)
    for p in SEQUENCE:
        positions = torch.tensor([[p], [p]])
        cos_ref, sin_ref = rotary_cls(config)(x, positions)  # a fresh module: no history
        want = hf_apply(q, k, cos_ref, sin_ref)
        for _ in range(2):  # checked (or growing), then planned
            got = rope(q, k, positions)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        cos, sin = drop_in(x, positions)
        torch.testing.assert_close(cos, cos_ref, rtol=0, atol=1e-6)
        torch.testing.assert_close(sin, sin_ref, rtol=0, atol=1e-6)
    if name == "dynamic":  # only the original length's set is ever tabled
        assert [key for _, key in rope._tables] == ["base"] and _rows(rope) == 4096
    if name == "longrope":
        assert _rows(rope, "base") == 4096 and _rows(rope, "long") == MAX_CACHE_LEN


def test_a_compiled_call_past_the_table_builds_none() -> None:
    # Traced calls never read a position on the host: cos/sin computed in the graph, no table.
    rope = RotaryEmbedding(D)
    compiled = torch.compile(rope, fullgraph=True, dynamic=False)
    q, k = _qk()
    positions = torch.tensor([[10**6], [10**5]])
    _close(compiled(q, k, positions), q, k, positions)
    assert not rope._tables


def test_a_module_pickled_before_the_tables_grew_loads() -> None:
    rope = RotaryEmbedding(D)
    q, k = _qk()
    positions = torch.full((2, 1), 3 * 10**6)
    state = dict(rope.__dict__)
    for name in ("max_cache_len", "_windows"):  # what a module of the earlier version lacked
        del state[name]
    state["_tables"] = {}  # a plain dict of (cos, sin) pairs
    old = RotaryEmbedding.__new__(RotaryEmbedding)
    old.__setstate__(state)
    _close(old(q, k, positions), q, k, positions)
    _close(old(q, k, torch.full((2, 1), 10**5)), q, k, torch.full((2, 1), 10**5))
