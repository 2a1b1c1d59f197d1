"""The sparse-attention indexers of DeepSeek-V3.2 and GLM-MoE-DSA against transformers.

Their indexers rotate the leading ``qk_rope_head_dim`` channels of ``index_head_dim`` heads with
the main attention's cos/sin but their own pairing: ``DeepseekV32Indexer`` half-split (its MLA is
interleaved), ``GlmMoeDsaIndexer`` interleaved. ``rope_from_hf(config, "indexer")`` is the
indexer's rotation, ``rope_from_hf(config)`` the MLA's; both are checked against the classes'
own rotary module and the functions each module calls, and in a tiny model whose top-k selection
(``index_topk`` below the sequence length) depends on the indexer's rotation.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc.hf import hf_rope_kwargs, rope_from_hf  # noqa: E402
from posenc.hf.patch import Rotation, fused_rotation  # noqa: E402
from posenc.hf.rotary import HFRotaryEmbedding  # noqa: E402
from posenc.hf.shadow import with_globals  # noqa: E402

# model_type -> (modeling module, class prefix, the function the indexer calls, its pairing)
TYPES = {
    "deepseek_v32": ("deepseek_v32", "DeepseekV32", "apply_rotary_pos_emb", "half"),
    "glm_moe_dsa": ("glm_moe_dsa", "GlmMoeDsa", "apply_rotary_pos_emb_interleave", "interleaved"),
}
TINY = dict(
    vocab_size=64, hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
    num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=32,
    kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4,
    num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1, index_topk=4,
    index_head_dim=32, index_n_heads=2, max_position_embeddings=256, attn_implementation="eager",
    rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                     "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1,
                     "mscale": 1.0, "mscale_all_dim": 1.0},
)  # fmt: skip


def _module(model_type: str) -> Any:
    name = TYPES[model_type][0]
    return importlib.import_module(f"transformers.models.{name}.modeling_{name}")


def _config(model_type: str, **extra: Any) -> Any:
    return transformers.CONFIG_MAPPING[model_type](**{**TINY, **extra})


def _model(model_type: str, **extra: Any) -> Any:
    """A tiny model with unit-variance projections (transformers' 0.02 init leaves attention
    nearly uniform, blind to its softmax scale)."""
    torch.manual_seed(0)
    model = getattr(transformers, f"{TYPES[model_type][1]}ForCausalLM")(
        _config(model_type, **extra)
    )
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.normal_(0.0, m.in_features**-0.5)
    return model.eval()


def _indexer_reference(model_type: str, config: Any, q: torch.Tensor, k: torch.Tensor,
                       positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The indexer's own steps on ``q [b, s, h, D]``, ``k [b, s, 1, D]``: split ``[rope | nope]``,
    the module's function with ``unsqueeze_dim=2``, concatenate."""
    module, prefix, fn, _ = (_module(model_type), *TYPES[model_type][1:])
    cos, sin = getattr(module, f"{prefix}RotaryEmbedding")(config)(q, positions)
    r = config.qk_rope_head_dim
    q_rot, k_rot = getattr(module, fn)(q[..., :r], k[..., :r], cos, sin, unsqueeze_dim=2)
    return torch.cat([q_rot, q[..., r:]], -1), torch.cat([k_rot, k[..., r:]], -1)


@pytest.mark.parametrize("model_type", sorted(TYPES))
@pytest.mark.parametrize("source", ["object", "dict", "dict without transformers"])
def test_indexer_rope_matches_transformers(model_type: str, source: str) -> None:
    config = _config(model_type)
    cfg = config if source == "object" else config.to_dict()
    own = {"use_transformers": source != "dict without transformers"}  # posenc's own reader
    layout = TYPES[model_type][3]
    kw = hf_rope_kwargs(cfg, "indexer", **own)
    assert (kw["head_dim"], kw["rotary_dim"], kw["layout"]) == (32, 16, layout)
    assert hf_rope_kwargs(cfg, **own)["layout"] == "interleaved"  # the MLA's, not the indexer's
    rope = rope_from_hf(cfg, "indexer", **own)
    positions = torch.tensor([[0, 1, 5, 63, 64, 255, 1023]])  # to 4x max_position_embeddings
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 7, 2, 32, generator=g)  # [b, s, h, D], as the indexer holds it
    k = torch.randn(1, 7, 1, 32, generator=g)
    want = _indexer_reference(model_type, config, q, k, positions)
    got = rope(q.transpose(1, 2), k.transpose(1, 2), positions)  # posenc takes [b, h, s, d]
    for g_, w in zip(got, want, strict=True):
        g_ = g_.transpose(1, 2)
        if layout == "interleaved":  # transformers writes the pairs back de-interleaved (the
            # same permutation of q and k: equal scores): [x0' x1' x2' x3'] -> [x0' x2' | x1' x3']
            g_ = torch.cat((g_[..., 0:16:2], g_[..., 1:16:2], g_[..., 16:]), -1)
        assert (g_ - w).abs().max().item() <= 1e-6
    # cos/sin: the main attention's (one rotary module serves both)
    module, prefix = _module(model_type), TYPES[model_type][1]
    cos_t, _ = getattr(module, f"{prefix}RotaryEmbedding")(config)(q, positions)
    cos, _ = rope.cos_sin(positions[0])
    assert (cos - cos_t[0, :, :8]).abs().max().item() <= 1e-6


def test_indexer_layout_is_caught_when_read_as_the_mla_one() -> None:
    """Negative control: DeepSeek-V3.2's indexer rotated in the MLA's interleaved pairs."""
    config = _config("deepseek_v32")
    positions = torch.tensor([[0, 3, 9, 200]])
    q, k = torch.randn(1, 4, 2, 32), torch.randn(1, 4, 1, 32)
    want = _indexer_reference("deepseek_v32", config, q, k, positions)
    rope = rope_from_hf(config, "indexer", layout="interleaved")
    got = rope(q.transpose(1, 2), k.transpose(1, 2), positions)
    assert (got[0].transpose(1, 2) - want[0]).abs().max().item() > 0.1


def _logits_diff(monkeypatch: Any, model_type: str, indexer_layout: str | None = None) -> float:
    """Logits of transformers' tiny model against the same model whose MLA and indexer rotate
    with the pairing posenc reads (``rope_from_hf``'s layout, fused kernels, posenc's cos/sin);
    ``indexer_layout`` plants another pairing in the indexer."""
    module, prefix, fn, _ = (_module(model_type), *TYPES[model_type][1:])
    model = _model(model_type)
    config = model.config
    ids = torch.randint(0, TINY["vocab_size"], (2, 32))
    with torch.no_grad():
        want = model(ids).logits
    main = hf_rope_kwargs(config)["layout"] == "interleaved"
    index = (indexer_layout or hf_rope_kwargs(config, "indexer")["layout"]) == "interleaved"
    stock = module.apply_rotary_pos_emb_interleave  # the MLA's, written back de-interleaved
    mla = fused_rotation(Rotation(interleaved=main, deinterleave=True), stock, "torch")
    indexer = fused_rotation(Rotation(interleaved=index), getattr(module, fn), "torch")
    attention, indexer_cls = (getattr(module, f"{prefix}{n}") for n in ("Attention", "Indexer"))
    with monkeypatch.context() as m:
        scope = {**vars(module), "apply_rotary_pos_emb_interleave": mla}
        m.setattr(attention, "forward", with_globals(attention.forward, scope))
        m.setattr(indexer_cls, "forward", with_globals(indexer_cls.forward, {**scope, fn: indexer}))
        m.setattr(model.model, "rotary_emb", HFRotaryEmbedding(config))
        with torch.no_grad():
            got = model(ids).logits
    return (got - want).abs().max().item()


@pytest.mark.parametrize("model_type", sorted(TYPES))
def test_tiny_model_logits_match_transformers(monkeypatch: Any, model_type: str) -> None:
    assert _logits_diff(monkeypatch, model_type) <= 1e-5
    other = "interleaved" if TYPES[model_type][3] == "half" else "half"
    assert _logits_diff(monkeypatch, model_type, indexer_layout=other) > 1e-3  # planted fault


@pytest.mark.parametrize("model_type", sorted(TYPES))
def test_apply_posenc_is_exact_with_and_without_scaling(model_type: str) -> None:
    """One call: the MLA's and the indexer's rotations fused (each by its own pairing), the
    logits those of the stock model; ``scaling=`` equals the model built with those rope
    parameters (rotary modules and the MLA's YaRN softmax scale; the indexer keeps its own)."""
    from posenc.hf import apply_posenc, remove_posenc

    prefix = TYPES[model_type][1]
    model = _model(model_type)
    ids = torch.randint(0, TINY["vocab_size"], (2, 32))
    with torch.no_grad():
        want = model(ids).logits
        apply_posenc(model)
        layers = {type(m).__name__ for m in model.posenc_patch.attention}
        assert layers == {f"{prefix}Attention", f"{prefix}Indexer"}
        assert (model(ids).logits - want).abs().max().item() <= 1e-5
        remove_posenc(model)
        new = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32,
               "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}  # fmt: skip
        ref = _model(model_type, rope_parameters={"rope_theta": 10000.0, **new})
        ref.load_state_dict(model.state_dict())
        apply_posenc(model, scaling=new)
        assert (model(ids).logits - ref(ids).logits).abs().max().item() <= 1e-5
        assert (model(ids).logits - want).abs().max().item() > 1e-3  # the scaling took effect
