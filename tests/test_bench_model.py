"""``posenc bench model``: the stock and patched models it times give the same logits, and the
rows and Markdown block carry every case (tiny shapes here; the real run is in RESULTS.md)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from posenc.bench import hf_model

SMALL = {**hf_model.MODEL_SHAPES, "hidden_size": 64, "intermediate_size": 96,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64}  # fmt: skip


def test_the_two_models_are_the_same_model() -> None:
    stock, fused = hf_model.tiny_llama(2, torch.float32, SMALL)
    assert fused.posenc_patch is not None and getattr(stock, "posenc_patch", None) is None
    ids = torch.randint(64, (2, 9))
    with torch.no_grad():
        assert float((stock(input_ids=ids).logits - fused(input_ids=ids).logits).abs().max()) < 1e-5


def test_rows_and_block_cover_every_case() -> None:
    cases = [("prefill", 1, 8), ("decode", 2, 8)]
    rows = hf_model.run_cases(cases, [torch.float32], layers=1, repeats=1, shapes=SMALL)
    assert [(r.phase, r.batch, r.tokens) for r in rows] == cases
    # Timings only: at these tiny shapes, on a busy machine, no ordering between them holds.
    assert all(r.stock_ms > 0 and r.posenc_ms > 0 and r.rope_share > 0 for r in rows)
    assert {"speedup", "rope_share", "rope_share_posenc", "stock_ms"} <= rows[0].as_dict().keys()
    block = hf_model.model_block(rows, {"torch": torch.__version__}, "posenc bench model")
    assert block.count("\n| prefill |") == 1 and block.count("\n| decode |") == 1


def test_cli_refuses_a_bad_dtype() -> None:
    from typer.testing import CliRunner

    from posenc.cli import app

    result = CliRunner().invoke(app, ["bench", "model", "--dtypes", "float8"])
    assert result.exit_code == 2 and "float8" in result.output


def test_the_speedup_noise_is_the_quartiles_of_paired_ratios() -> None:
    import statistics

    stock, posenc = [10.0, 12.0, 9.0, 30.0, 11.0], [10.0, 10.0, 10.0, 10.0, 10.0]
    ratios = sorted(a / b for a, b in zip(stock, posenc, strict=True))  # a naive pairing
    q1, q2, q3 = hf_model.paired_quartiles(stock, posenc)
    assert (q1, q2, q3) == (ratios[1], ratios[2], ratios[3])  # inclusive quartiles of 5 values
    assert q2 == statistics.median(ratios)
    assert hf_model.paired_quartiles([2.0], [1.0]) == (2.0, 2.0, 2.0)


def test_the_speedup_is_the_median_of_paired_ratios() -> None:
    # Load from round 3 on, which in round 3 hit posenc's sample only: the ratio of the
    # medians (10 / 27) says posenc is 2.7x slower; 4 of 5 rounds say 1.11x faster.
    stock, posenc = [10.0, 10.0, 10.0, 30.0, 30.0], [9.0, 9.0, 27.0, 27.0, 27.0]
    q1, q2, q3 = hf_model.paired_quartiles(stock, posenc)
    row = hf_model.ModelRow("decode", 8, 8, "bfloat16", 1, 10.0, 27.0, 0.2, 0.1, q1, q3, q2)
    assert row.speedup == q2 == 10.0 / 9.0
    old = hf_model.ModelRow("decode", 8, 8, "bfloat16", 1, 10.0, 27.0, 0.2, 0.1)
    assert old.speedup == 10.0 / 27.0  # a row without the paired median


def test_old_rows_without_the_noise_still_render() -> None:
    row = hf_model.ModelRow("decode", 1, 8, "float32", 1, 2.0, 1.0, 0.2, 0.1).as_dict()
    del row["speedup_q1"], row["speedup_q3"]
    doc = hf_model.model_doc([], {}, "posenc bench model")
    doc.rows = [row]
    assert "| decode | 1 | 8 | float32 |" in hf_model.block(doc)
