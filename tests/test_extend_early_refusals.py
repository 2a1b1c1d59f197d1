"""Refusals before anything runs, for any family (issue 53, item 5): each is one ``error:`` line
from ``posenc extend`` (before ``run.json`` is written, ``--dry-run`` too) and a ValueError
from the API, where the code before gave a traceback from inside the forward.

* a Gemma-3 text config whose layers are all sliding, given a flat scaling (the flat scaling
  goes to the full-attention layers, and there are none: was ``AssertionError: unreachable``);
* GPT-2 (learned absolute positions) asked past ``n_positions`` (was an IndexError);
* a tokenizer whose ids reach past the model's vocabulary (was an IndexError);
* ``group_size=10**30`` (was accepted, then overflowed in the forward).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")

from _cli_here import posenc_here
from _tiny import PARITY_SIZES, bpe_tokenizer, tiny_folder, tiny_lm
from posenc.hf import apply_posenc

SLIDING = {"layer_types": ["sliding_attention"] * 2, "sliding_window": 8}


def _extend(folder: Path, out: Path, *args: str) -> str:
    """``posenc extend`` refused (exit 2) in one line, with nothing written in ``out``."""
    text = posenc_here("extend", str(folder), "--out", str(out), *args, code=2)
    lines = [x for x in text.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in text, text
    assert not (out / "run.json").exists()
    return lines[0]


def test_gemma3_all_sliding_flat_scaling(tmp_path: Path) -> None:
    model = tiny_lm("gemma3_text", attn="eager", **PARITY_SIZES, **SLIDING)
    with pytest.raises(ValueError, match="full_attention layers, and it has none"):
        apply_posenc(model, scaling={"rope_type": "linear", "factor": 2.0})
    assert getattr(model, "posenc_patch", None) is None
    # keyed by its one layer type, or layers='all', it is scaled
    apply_posenc(model, scaling={"rope_type": "linear", "factor": 2.0}, scaling_layers="all")
    folder = tiny_folder(tmp_path / "m", 32, "gemma3_text", head_dim=16, **SLIDING)
    line = _extend(folder, tmp_path / "o", "--methods", "none,linear", "--lengths", "48")
    assert "method linear" in line and "layers='all'" in line


@pytest.mark.parametrize("dry_run", [False, True])
def test_gpt2_past_its_learned_positions(tmp_path: Path, dry_run: bool) -> None:
    folder = tiny_folder(tmp_path / "m", 32, "gpt2", n_positions=32, n_embd=64, n_layer=2, n_head=4)
    more = ["--dry-run"] if dry_run else []
    line = _extend(folder, tmp_path / "o", "--methods", "none", "--lengths", "48", *more)
    assert "--lengths asks for 48 tokens" in line and "for 32 tokens only" in line
    # within its table, the dry run plans (its timing forward within the table too)
    out = posenc_here("extend", str(folder), "--out", str(tmp_path / "o"), "--methods", "none",
                      "--lengths", "16,32", "--dry-run")  # fmt: skip
    assert "Nothing was run" in out


def test_tokenizer_past_the_vocabulary(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    tiny_lm("llama", vocab_size=100, max_position_embeddings=32).save_pretrained(folder)
    bpe_tokenizer().save_pretrained(folder)  # 320 tokens
    line = _extend(folder, tmp_path / "o", "--methods", "none", "--lengths", "32")
    assert "the model's vocabulary has 100 ids (0-99)" in line


def test_huge_integer_options(tmp_path: Path) -> None:
    from posenc.extend.methods.names import parse_method

    huge = 10**30
    with pytest.raises(ValueError, match=r"group_size must be an integer in \[1, 2147483647\]"):
        parse_method(f"self_extend:group_size={huge}")
    with pytest.raises(ValueError, match=r"original_max_position_embeddings must be an integer in"):
        parse_method(f"yarn:original_max_position_embeddings={huge}")
    with pytest.raises(ValueError, match=r"chunk_size must be an integer in \[2, 2147483647\]"):
        apply_posenc(tiny_lm("llama", **PARITY_SIZES),
                     extension={"method": "dual_chunk", "chunk_size": huge, "local_size": 4})  # fmt: skip
    folder = tiny_folder(tmp_path / "m", 32)
    line = _extend(folder, tmp_path / "o", "--methods", f"self_extend:group_size={huge}",
                   "--lengths", "48")  # fmt: skip
    assert "group_size must be an integer in [1, 2147483647]" in line
