"""DeepSeek-V4 with :func:`posenc.hf.apply_posenc`: a tiny model's logits against transformers.

``apply_posenc`` replaces the model's ``DeepseekV4RotaryEmbedding`` modules by posenc's (both
labelled sets, ``main`` and ``compress``) and every call of ``apply_rotary_pos_emb`` (queries, the
shared key/value head, the compressors' and the indexer's keys, and the attention output's
rotation by minus the angle that undoes the values' rotation) by posenc's fused rotation of the
trailing slice. The stock model on the same weights is the reference; planted faults (another
pairing, the leading slice, the output's rotation by plus the angle or not at all, the
compressed layers reading ``main``) each move the logits far.

The published DeepSeek-V4 configs (``tests/data/hf_configs/deepseek-v4-*.json``, which the
corpus harness also runs by label) are read here by label against the class's own rotary
module, to 4x their ``max_position_embeddings``.
"""

from __future__ import annotations

import copy
import inspect
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
ds4 = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")

from _tiny import DEEPSEEK_V4_TINY as TINY  # noqa: E402
from posenc.hf import apply_posenc, remove_posenc, rope_from_hf  # noqa: E402
from posenc.hf import one_tensor as hf_one_tensor  # noqa: E402
from posenc.hf import patch as hf_patch  # noqa: E402
from posenc.hf import shadow as hf_shadow  # noqa: E402
from posenc.hf.rotary import HFRotaryEmbedding, apply_rotary_emb  # noqa: E402
from posenc.rotary import rotate_trailing  # noqa: E402

SEQ = 40  # 10 CSA windows (index_topk 4 picks among them), 5 HCA windows


def _model(dtype: torch.dtype = torch.float32) -> Any:
    """The tiny model with unit-variance projections (transformers' 0.02 init leaves attention
    nearly uniform, so a wrong rotation would move the logits little)."""
    torch.manual_seed(0)
    model = transformers.DeepseekV4ForCausalLM(transformers.DeepseekV4Config(**TINY))
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.normal_(0.0, m.in_features**-0.5)
    return model.to(dtype).eval()


def _ids() -> torch.Tensor:
    return torch.randint(
        0, TINY["vocab_size"], (2, SEQ), generator=torch.Generator().manual_seed(1)
    )


def _logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits.float()


def test_logits_equal_the_stock_model() -> None:
    """float32: posenc's tables and rotations give transformers' logits (measured: 0.0)."""
    model, ids = _model(), _ids()
    want = _logits(model, ids)
    apply_posenc(model)
    patched = {type(m).__name__ for m in model.posenc_patch.attention}
    assert patched == {
        "DeepseekV4Attention", "DeepseekV4CSACompressor", "DeepseekV4HCACompressor",
        "DeepseekV4Indexer",
    }  # fmt: skip
    rotary = [m for m in model.modules() if isinstance(m, HFRotaryEmbedding)]
    assert len(rotary) == 4 and all(r.layer_types == ("main", "compress") for r in rotary)
    assert not any(isinstance(m, ds4.DeepseekV4RotaryEmbedding) for m in model.modules())
    for layer in model.posenc_patch.attention:
        rotate = inspect.unwrap(layer.forward.fn).__globals__["apply_rotary_pos_emb"]
        assert rotate.__name__ == "posenc_apply_rotary_pos_emb"
    got = _logits(model, ids)
    assert (got - want).abs().max().item() <= 1e-5
    remove_posenc(model)
    assert any(isinstance(m, ds4.DeepseekV4RotaryEmbedding) for m in model.modules())
    assert torch.equal(_logits(model, ids), want)


def test_generate_with_the_cache_equals_the_stock_model() -> None:
    """Decoding step by step through DeepSeek-V4's sliding/CSA/HCA caches: the same scores."""
    model, ids = _model(), _ids()[:1, :30]
    kw = dict(max_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True)
    want = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    apply_posenc(model)
    got = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    assert torch.equal(got.sequences, want.sequences)
    worst = max((g - w).abs().max().item() for g, w in zip(got.logits, want.logits, strict=True))
    assert worst <= 1e-5


def test_scaling_by_label_equals_transformers_built_with_it() -> None:
    """``scaling={"compress": ...}``: the model built with those rope parameters (measured 0.0;
    the logits move 1.7 from the model's own)."""
    yarn = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32,
            "beta_fast": 32, "beta_slow": 1}  # fmt: skip
    model, ids = _model(), _ids()
    main = dict(model.config.rope_parameters["main"])
    before = _logits(model, ids)
    apply_posenc(model, scaling={"compress": yarn})
    compress = {**yarn, "rope_theta": 160000.0, "partial_rotary_factor": 0.5}
    params = {"main": main, "compress": compress}
    config = transformers.DeepseekV4Config(**{**TINY, "rope_parameters": params})
    reference = transformers.DeepseekV4ForCausalLM(config).eval()
    reference.load_state_dict(model.state_dict())
    got = _logits(model, ids)
    assert (got - _logits(reference, ids)).abs().max().item() <= 1e-5
    assert (got - before).abs().max().item() > 0.1


def _float32_frequencies(model: Any) -> None:
    """Give the model's rotary modules their float32 frequencies back (``model.to(bfloat16)``
    rounds transformers' ``inv_freq`` buffers; posenc keeps its frequencies in float32)."""
    fresh = ds4.DeepseekV4RotaryEmbedding(model.config)
    for module in model.modules():
        if isinstance(module, ds4.DeepseekV4RotaryEmbedding):
            for name, buffer in fresh.named_buffers():
                setattr(module, name, buffer.clone())


def test_bfloat16_no_worse_than_transformers() -> None:
    """bfloat16: against the float32 logits, posenc's error is at most the stock model's
    (measured 0.50 and 0.54: the stock model rotates by bf16-rounded frequencies); with the stock
    model's frequencies put back in float32 the logits are equal (0.0)."""
    ids = _ids()
    exact = _logits(_model(), ids)
    model = _model(torch.bfloat16)
    stock = _logits(model, ids)
    _float32_frequencies(model)
    stock_fp32_freq = _logits(model, ids)
    apply_posenc(model)
    ours = _logits(model, ids)
    assert (ours - exact).abs().max().item() <= (stock - exact).abs().max().item()
    assert (ours - stock_fp32_freq).abs().max().item() <= 1e-5


# --- planted faults ------------------------------------------------------------------------------


def _leading_slice(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1,
                   **kw: Any) -> torch.Tensor:  # fmt: skip
    """The fault: the leading ``r`` channels rotated, as a ``[rope | nope]`` model would."""
    r = 2 * cos.shape[-1]
    rope = apply_rotary_emb(x[..., :r], cos, sin, interleaved=True, table_layout="half")
    return torch.cat((rope, x[..., r:]), dim=-1)


def _attention_forward(old: str, new: str) -> Any:
    """DeepseekV4Attention.forward with its output's rotation edited (``old`` -> ``new``)."""
    source = textwrap.dedent(inspect.getsource(ds4.DeepseekV4Attention.forward))
    assert source.count(old) == 1, "transformers' DeepseekV4Attention.forward changed"
    scope = dict(vars(ds4))
    exec(compile(source.replace(old, new), ds4.__file__, "exec"), scope)
    return scope["forward"]


UNDO = "apply_rotary_pos_emb(attn_output.transpose(1, 2), cos, -sin).transpose(1, 2)"


def _plant(m: pytest.MonkeyPatch, fault: str) -> None:
    if fault == "half pairing":
        wrong = hf_patch.Rotation(interleaved=False, table_layout="half", trailing=True)
        entry = ("deepseek_v4", {"apply_rotary_pos_emb": wrong})
        m.setitem(hf_patch.SUPPORTED, "deepseek_v4", entry)
    elif fault == "leading slice":
        m.setattr(hf_one_tensor, "apply_rotary_trailing", _leading_slice)
    elif fault == "output rotated by +theta":
        m.setattr(ds4.DeepseekV4Attention, "forward", _attention_forward("cos, -sin", "cos, sin"))
    elif fault == "output not rotated back":
        m.setattr(ds4.DeepseekV4Attention, "forward", _attention_forward(UNDO, "attn_output"))
    if fault in ("half pairing", "leading slice"):  # a wrong stand-in: the probe refuses it first
        with pytest.raises(RuntimeError, match="no longer rotates as posenc expects"):
            apply_posenc(_model())
        m.setattr(hf_patch, "check_rotation", lambda *a: None)


FAULTS = [
    "half pairing", "leading slice", "output rotated by +theta", "output not rotated back",
    "compressed layers read main",
]  # fmt: skip


@pytest.mark.parametrize("fault", FAULTS)
def test_planted_faults_move_the_logits(monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    model, ids = _model(), _ids()
    want = _logits(model, ids)
    with monkeypatch.context() as m:
        # fresh shadows and forward copies, so the planted stand-in or forward is the one read
        m.setattr(hf_shadow, "_SHADOWS", {})
        m.setattr(hf_shadow, "_FORWARDS", {})
        _plant(m, fault)
        apply_posenc(model)
        if fault == "compressed layers read main":
            for rotary in model.modules():
                if isinstance(rotary, HFRotaryEmbedding):
                    rotary.ropes["compress"] = rotary.ropes["main"]
        got = _logits(model, ids)
    assert (got - want).abs().max().item() > 0.1, fault


# --- the published configs, by label ------------------------------------------------------------

DATA = Path(__file__).parent / "data"
# wherever the corpus keeps them
DS4_FILES = sorted(str(p.relative_to(DATA)) for p in DATA.glob("hf_configs*/**/deepseek-v4-*.json"))


def test_the_published_configs_are_found() -> None:
    assert {Path(n).name for n in DS4_FILES} >= {"deepseek-v4-flash.json", "deepseek-v4-pro.json"}


def _raw(name: str) -> dict[str, Any]:
    raw = json.loads((DATA / name).read_text())
    return {k: v for k, v in raw.items() if not k.startswith("_")}


@pytest.mark.parametrize("name", DS4_FILES)
@pytest.mark.parametrize("source", ["dict", "object", "dict without transformers"])
@pytest.mark.parametrize("label", ["main", "compress", "indexer"])
def test_published_configs_by_label(name: str, source: str, label: str) -> None:
    """Each label of the published file against ``DeepseekV4RotaryEmbedding`` (the indexer's
    reads ``compress``): cos/sin and the rotated q / shared kv heads, positions to 4x max."""
    raw = _raw(name)
    obj = transformers.DeepseekV4Config.from_dict(copy.deepcopy(raw))
    theirs = ds4.DeepseekV4RotaryEmbedding(obj)
    their_label = ds4.DeepseekV4Indexer.rope_layer_type if label == "indexer" else label
    top = 4 * raw["max_position_embeddings"]
    orig = obj.rope_parameters["compress"]["original_max_position_embeddings"]
    positions = torch.tensor([[0, 1, 7, 100, orig - 1, orig, orig + 1, top // 2, top - 1]])
    cos_t, sin_t = theirs(torch.zeros(1), positions, layer_type=their_label)  # [1, s, r/2]
    config = obj if source == "object" else raw
    rope = rope_from_hf(config, label, use_transformers=source != "dict without transformers")
    cos, sin = rope.cos_sin(positions[0])  # [s, r/2]
    assert (cos - cos_t[0]).abs().max().item() <= 1e-6
    assert (sin - sin_t[0]).abs().max().item() <= 1e-6
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, positions.shape[1], obj.head_dim, generator=g)  # [b, h, s, d]
    c, s = cos[None, None], sin[None, None]
    for x in (q, q[:, :1], q[..., : obj.index_head_dim]):  # queries, shared kv, indexer head
        want = ds4.apply_rotary_pos_emb(x, cos_t, sin_t)
        assert (rotate_trailing(x, c, s, "interleaved") - want).abs().max().item() <= 1e-5
        undo = ds4.apply_rotary_pos_emb(x, cos_t, -sin_t)
        assert (rotate_trailing(x, c, s, "interleaved", conj=True) - undo).abs().max() <= 1e-5
