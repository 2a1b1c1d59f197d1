"""``posenc extend --dry-run`` names, per layer type, what each method does (issue 53, item 3):
a scaling where transformers puts it (Gemma-3's full-attention layers; every RoPE layer of a
one-set config, never a NoPE or linear-attention layer), a key-set method where apply_posenc put
it. The layer kinds are read from the config (window, rope base, NoPE), independently written
here."""

from __future__ import annotations

from pathlib import Path

from _cli_here import posenc_here
from _tiny import tiny_folder
from _tiny_families import tiny_family
from posenc.extend.methods.apply import with_method
from posenc.extend.methods.layer_plan import describe_method
from posenc.extend.methods.names import parse_method, resolve


def _plan(model, text: str, trained: int = 16, target: int = 64) -> str:  # type: ignore[no-untyped-def]
    resolved = resolve(parse_method(text), trained, target, 8)
    undo = with_method(model, resolved)
    try:
        lines = getattr(getattr(model, "posenc_patch", None), "layers", ())
        return describe_method(model, resolved, lines)
    finally:
        undo()


def test_llama4_nope_and_chunked_layers() -> None:
    model = tiny_family("llama4_text", no_rope_layers=[1, 0, 1, 1],
                        layer_types=["chunked_attention", "full_attention", "full_attention",
                                     "chunked_attention"])  # fmt: skip
    line = _plan(model, "self_extend")
    assert line.startswith("self_extend: layers 0,3 (chunked, rope θ=500k): untouched"), line
    assert "layer 1 (full, NoPE): untouched: no RoPE" in line
    assert "layer 2 (full, rope θ=500k): self_extend (full attention with RoPE)" in line


def test_qwen3_next_linear_layers_are_untouched_by_a_scaling() -> None:
    line = _plan(tiny_family("qwen3_next"), "yarn")
    assert line == (
        "yarn: layer 0 (linear, no softmax attention): untouched (no RoPE); "
        "layer 1 (full, rope θ=10k, 4 of 16 dims): yarn factor 4"
    ), line


def test_dry_run_prints_the_plan_per_layer_type(tmp_path: Path) -> None:
    folder = tiny_folder(tmp_path / "m", 32, "gemma3_text", head_dim=16, num_hidden_layers=4,
                         layer_types=["sliding_attention"] * 3 + ["full_attention"],
                         sliding_window=8)  # fmt: skip
    out = posenc_here("extend", str(folder), "--out", str(tmp_path / "o"), "--methods",
                      "none,yarn,self_extend", "--lengths", "16,64", "--dry-run")  # fmt: skip
    assert "none: layers 0-2 (sliding, rope θ=10k): as trained; layer 3 (full, rope θ=1M): " \
           "as trained" in out  # fmt: skip
    assert "yarn: layers 0-2 (sliding, rope θ=10k): untouched (its layer type is not scaled); " \
           "layer 3 (full, rope θ=1M): yarn factor 2" in out  # fmt: skip
    assert "self_extend: layers 0-2 (sliding, rope θ=10k): untouched: its sliding window 8 " \
           "never sees a longer distance; layer 3 (full, rope θ=1M): self_extend" in out  # fmt: skip
    assert not (tmp_path / "o" / "run.json").exists()


def test_inspect_names_what_each_method_does_per_layer_type() -> None:
    # gpt-oss-20b's released config: sliding (window 128) and full layers alternating, one rope
    # set; built on the meta device, its rotary modules on the CPU
    path = Path(__file__).parent / "data" / "hf_configs" / "gpt-oss-20b.json"
    out = posenc_here("inspect", str(path), "--methods", "none,yarn,self_extend")
    odd, even = ",".join(map(str, range(1, 24, 2))), ",".join(map(str, range(0, 24, 2)))
    assert f"yarn: layers {even} (sliding, rope θ=150k): yarn factor 2; layers {odd} " \
           "(full, rope θ=150k): yarn factor 2" in out  # fmt: skip
    assert f"self_extend: layers {even} (sliding, rope θ=150k): untouched: its sliding window " \
           f"128 never sees a longer distance; layers {odd} (full, rope θ=150k): self_extend" in out  # fmt: skip
    llama4 = (
        Path(__file__).parent
        / "data"
        / "hf_configs"
        / "llama-4-scout-17b-16e-instruct-fp8-dynamic.json"
    )
    out = posenc_here("inspect", str(llama4), "--methods", "yarn")
    # its one rotary module feeds the chunked RoPE layers (one complex table): YaRN scales them,
    # as transformers does with the same rope_parameters; the NoPE layers have no positions
    assert "(chunked, rope θ=500k): yarn factor 2" in out
    assert "(full, NoPE): untouched (no RoPE)" in out


def test_a_family_only_the_hf_rotary_module_reproduces_gets_a_plan() -> None:
    """Ergo's float64 angles of float32 frequencies: rope_from_hf refuses it, apply_posenc takes
    it, and the dry run's plan reads its layers (it said "no per-layer plan" before)."""
    from posenc.testing.coverage import tiny_model

    line = _plan(tiny_model("ergo"), "yarn")
    assert line == (
        "yarn: layers 0-2 (sliding, rope θ=1M): yarn factor 4; layer 3 (full, NoPE): untouched "
        "(no RoPE)"
    ), line
