"""The fast GGUF reader (posenc.hf.gguf_read) reads exactly what gguf's own reader reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from posenc.hf.gguf_read import fast_reader, gguf_read_once  # noqa: E402


def _file(path: Path, big_endian: bool = False) -> Path:
    """A GGUF with every kind of field a model file has: a vocabulary of strings of many lengths
    (empty, multi-byte UTF-8), scores, token types, scalars of each width, and tensors."""
    rng = np.random.default_rng(0)
    order = gguf.GGUFEndian.BIG if big_endian else gguf.GGUFEndian.LITTLE
    writer = gguf.GGUFWriter(str(path), "llama", endianess=order)
    writer.add_context_length(8192)
    writer.add_rope_freq_base(1e5)
    writer.add_bool("test.flag", True)
    writer.add_uint64("test.big", 2**40 + 3)
    writer.add_int8("test.small", -7)
    writer.add_string("test.name", "Gemma-3 → ü")
    tokens = ["", "a", "▁the", "日本語", "x" * 300] + [f"tok{i}" * (i % 7) for i in range(3000)]
    writer.add_token_list(tokens)
    writer.add_token_scores(rng.standard_normal(len(tokens)).astype(np.float32).tolist())
    writer.add_token_types([int(t) for t in rng.integers(1, 6, len(tokens))])
    writer.add_array("test.ints", [int(v) for v in rng.integers(-(2**31), 2**31, 17)])
    writer.add_tensor("token_embd.weight", rng.standard_normal((12, 8)).astype(np.float32))
    writer.add_tensor("blk.0.attn_q.weight", rng.standard_normal((8, 8)).astype(np.float16))
    q8 = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32),
                              gguf.GGMLQuantizationType.Q8_0)  # fmt: skip
    writer.add_tensor("blk.0.ffn_up.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _same(a: Any, b: Any) -> None:
    assert list(a.fields) == list(b.fields)
    for name, fa in a.fields.items():
        fb = b.fields[name]
        assert (fa.offset, fa.data, fa.types) == (fb.offset, fb.data, fb.types), name
        assert len(fa.parts) == len(fb.parts), name
        for x, y in zip(fa.parts, fb.parts, strict=True):
            assert x.dtype == y.dtype and np.array_equal(x, y), name
        assert fa.contents() == fb.contents(), name
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
    for ta, tb in zip(a.tensors, b.tensors, strict=True):
        assert (ta.tensor_type, list(ta.shape), ta.data_offset) == (
            tb.tensor_type, list(tb.shape), tb.data_offset,
        )  # fmt: skip
        assert ta.data.dtype == tb.data.dtype and np.array_equal(ta.data, tb.data), ta.name


@pytest.mark.parametrize("big_endian", [False, True])
def test_every_field_and_tensor_equals_the_stock_readers(tmp_path: Path, big_endian: bool) -> None:
    path = _file(tmp_path / "m.gguf", big_endian)
    fast = fast_reader(gguf.GGUFReader)
    assert fast is not gguf.GGUFReader and issubclass(fast, gguf.GGUFReader)
    _same(fast(path), gguf.GGUFReader(path))


def test_inside_the_context_the_reader_is_fast_and_shared(tmp_path: Path) -> None:
    path = _file(tmp_path / "m.gguf")
    stock = gguf.GGUFReader
    with gguf_read_once():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first  # a Path and its text: one file, one reader
        assert type(first).__name__ == "FastGGUFReader" and isinstance(first, stock)
    assert gguf.GGUFReader is stock
    assert type(gguf.GGUFReader(path)) is stock


def test_a_reader_of_another_shape_is_left_as_it_is() -> None:
    class Other:
        def _get(self, offset: int, dtype: Any) -> None: ...

    assert fast_reader(Other) is Other
    assert fast_reader(len) is len  # not a class


def test_a_wrong_view_would_be_caught(tmp_path: Path) -> None:
    """The comparison fails for a reader one byte off (it checks something)."""
    path = _file(tmp_path / "m.gguf")
    fast = fast_reader(gguf.GGUFReader)

    class OffByOne(fast):  # type: ignore[misc, valid-type]
        def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> Any:
            shift = 1 if np.dtype(dtype) == np.float32 else 0  # the scores and float tensors
            return super()._get(offset + shift, dtype, count, override_order)

    with pytest.raises(AssertionError):
        _same(OffByOne(path), gguf.GGUFReader(path))
