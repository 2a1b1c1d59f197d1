"""Bad input to posenc.hf found from outside: each refused in one line naming what was wrong and
what is allowed (never a traceback, a hang or another library's message), or made to work."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from typer.testing import CliRunner  # noqa: E402

from _hf_corpus_paths import config_path  # noqa: E402
from posenc.cli import app  # noqa: E402
from posenc.hf import apply_posenc, position_plan  # noqa: E402
from posenc.hf.checks import LAYER_TYPES, MAX_LAYERS  # noqa: E402

runner = CliRunner()
LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
         "num_hidden_layers": 2, "max_position_embeddings": 256}  # fmt: skip


def _one_line_error(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def _tiny_llama(**kw: Any) -> Any:
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, **kw,
    )  # fmt: skip
    return cfg


# --- item: implausible layer counts ----------------------------------------------------------


@pytest.mark.parametrize("layers", [10**9, 10**7, MAX_LAYERS + 1])
@pytest.mark.parametrize("use_transformers", [True, False])
def test_an_implausible_layer_count_is_refused_at_once(layers: int, use_transformers: bool) -> None:
    start = time.perf_counter()
    with pytest.raises(ValueError, match=f"at most {MAX_LAYERS} decoder layers"):
        position_plan({**LLAMA, "num_hidden_layers": layers}, use_transformers=use_transformers)
    assert time.perf_counter() - start < 5  # was: no answer in 120 s (10**7), killed (10**9)


def test_the_layer_limit_is_refused_in_text_config_and_on_the_command_line(tmp_path: Path) -> None:
    nested = {"model_type": "qwen2_vl", "text_config": {**LLAMA, "num_hidden_layers": 10**9}}
    with pytest.raises(ValueError, match=r"\['text_config'\]\['num_hidden_layers'\] is 10+"):
        position_plan(nested, use_transformers=False)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, "num_hidden_layers": 10**9}))
    assert f"at most {MAX_LAYERS}" in _one_line_error(["inspect", str(path)])


def test_a_config_object_with_too_many_layers_is_refused() -> None:
    cfg = _tiny_llama()
    cfg.num_hidden_layers = MAX_LAYERS + 1  # set after construction: the class built no list
    with pytest.raises(ValueError, match=f"at most {MAX_LAYERS}"):
        position_plan(cfg)


def test_the_limit_keeps_every_real_size_readable() -> None:
    plan = position_plan({**LLAMA, "num_hidden_layers": MAX_LAYERS}, use_transformers=False)
    assert plan.num_layers == MAX_LAYERS


# --- item: deeply nested JSON ------------------------------------------------------------------


@pytest.mark.parametrize("depth", [100_000, 200])
def test_deeply_nested_json_is_one_line(tmp_path: Path, depth: int) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "x": ' + "[" * depth + "]" * depth + "}")
    assert "levels deep" in _one_line_error(["inspect", str(path)])
    with pytest.raises(ValueError, match="levels deep"):
        position_plan(path)


# --- item: the rotation probe on the meta device ---------------------------------------------


@pytest.mark.parametrize("scaling", [None, {"rope_type": "linear", "factor": 2.0}])
def test_apply_posenc_under_the_meta_device_then_load(scaling: dict[str, Any] | None) -> None:
    """Build on meta, patch, then materialize and load: logits equal the stock model's."""
    cfg = _tiny_llama()
    torch.manual_seed(0)
    stock = transformers.LlamaForCausalLM(cfg).eval()
    if scaling is not None:  # stock transformers with the same rope parameters
        stock = transformers.LlamaForCausalLM(_tiny_llama(rope_parameters=scaling)).eval()
        stock.load_state_dict(transformers.LlamaForCausalLM(cfg).state_dict())
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
        apply_posenc(model, scaling=scaling)
    model.to_empty(device="cpu")
    model.load_state_dict(stock.state_dict())
    for name, buf in stock.named_buffers():  # stock's non-persistent rotary buffers, as a loader
        if name in dict(model.named_buffers()):
            model.get_buffer(name).copy_(buf)
    model.eval()
    ids = torch.randint(0, 64, (2, 20))
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, stock(ids).logits, atol=1e-5, rtol=0)


def test_apply_posenc_under_meta_then_assign() -> None:
    cfg = _tiny_llama()
    stock = transformers.LlamaForCausalLM(cfg).eval()
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
        apply_posenc(model)
    model.load_state_dict(stock.state_dict(), assign=True)
    for name, buf in stock.named_buffers():  # non-persistent: not in the state dict
        owner, _, attr = name.rpartition(".")
        model.get_submodule(owner).register_buffer(attr, buf.clone(), persistent=False)
    assert model.posenc_patch.model_type == "llama"
    assert all(not p.is_meta for p in model.parameters())
    ids = torch.randint(0, 64, (2, 20))
    with torch.no_grad():
        assert torch.allclose(model.eval()(ids).logits, stock(ids).logits, atol=1e-5, rtol=0)


# --- items: apply_posenc's scaling argument ----------------------------------------------------


@pytest.mark.parametrize("scaling", ["yarn", 4.0, ["yarn"]])
def test_scaling_that_is_not_a_dict_says_what_is_expected(scaling: Any) -> None:
    model = transformers.LlamaForCausalLM(_tiny_llama())
    with pytest.raises(TypeError, match=r"scaling must be a dict of rope parameters.*'yarn'"):
        apply_posenc(model, scaling=scaling)
    assert getattr(model, "posenc_patch", None) is None


@pytest.mark.parametrize(
    "scaling",
    [
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": "4096"},
        {"rope_type": "linear", "factor": "4"},
        {"full_attention": {"rope_type": "yarn", "factor": "2"}},
    ],
)
def test_a_string_where_a_number_goes_is_posencs_message(scaling: dict[str, Any]) -> None:
    model = transformers.LlamaForCausalLM(_tiny_llama())
    with pytest.raises(ValueError, match=r"^scaling(\['full_attention'\])?\['\w+'\] must be a num"):
        apply_posenc(model, scaling=scaling)


# --- item: position_plan without transformers --------------------------------------------------


def test_the_plan_refuses_a_hidden_size_that_does_not_divide() -> None:
    with pytest.raises(ValueError, match=r"hidden_size \(65\) must be a multiple of num_attention"):
        position_plan({**LLAMA, "hidden_size": 65}, use_transformers=False)


def test_the_plan_refuses_an_unknown_layer_type() -> None:
    raw = {**LLAMA, "layer_types": ["full_attention", "ful_attention"]}
    with pytest.raises(ValueError, match=r"layer_types\[1\] is 'ful_attention'.*full_attention"):
        position_plan(raw, use_transformers=False)
    with pytest.raises(Exception, match="layer_types"):  # transformers' own class refuses it
        transformers.LlamaConfig(**{k: v for k, v in raw.items() if k != "model_type"})


def test_posencs_layer_types_are_transformers_list() -> None:
    from transformers.configuration_utils import ALLOWED_ATTN_LAYER_TYPES

    assert set(LAYER_TYPES) == set(ALLOWED_ATTN_LAYER_TYPES)


@pytest.mark.parametrize("max_pos", [-5, 0, 2.5])
def test_the_plan_refuses_a_bad_max_position_embeddings(max_pos: float) -> None:
    with pytest.raises(ValueError, match="max_position_embeddings must be a positive integer"):
        position_plan({**LLAMA, "max_position_embeddings": max_pos}, use_transformers=False)


# --- item: a model_type nobody knows, with the pairing named ----------------------------------

# MiniCPM4-8B's published config.json (openbmb/MiniCPM4-8B, remote code: model_type "minicpm",
# which transformers does not register), verbatim from sophgo/LLM-TPU
# models/MiniCPM4/config/config.json @ 3dad39a4dc5d5a622e323ffb0efe12597b49c182 (its entry in
# tests/data/hf_configs/SOURCES.jsonl).
MINICPM4_8B = "refused/minicpm4-8b"


def test_an_unknown_model_type_with_a_named_layout_reads() -> None:
    """MiniCPM's remote modeling code (MiniCPMLongRoPE): Llama's rotate_half over
    cat(freqs, freqs), theta 10000, head_dim = hidden_size / heads, each frequency divided by
    its short_factor (the sequence is within original_max_position_embeddings) and cos/sin
    scaled by sqrt(1 + log(max_pos / original) / log(original)), 1 here; checked against that
    formula in float64 and a naive loop."""
    from transformers import CONFIG_MAPPING

    from posenc.hf import rope_from_hf

    raw = json.loads(config_path(MINICPM4_8B).read_text())
    assert "minicpm" not in CONFIG_MAPPING and raw["model_type"] == "minicpm"
    with pytest.raises(ValueError, match=r"unknown model_type 'minicpm'.*layout="):
        rope_from_hf(raw)  # without a layout: the pairing is unknown
    for use_transformers in (True, False):
        rope = rope_from_hf(raw, layout="half", use_transformers=use_transformers)
        assert (rope.head_dim, rope.rotary_dim, rope.layout) == (128, 128, "half")
    d, pos = 128, torch.tensor([0, 1, 17, 4095, 32767])
    scaling = raw["rope_scaling"]
    original = scaling["original_max_position_embeddings"]
    scale = math.sqrt(1 + math.log(raw["max_position_embeddings"] / original) / math.log(original))
    short = torch.tensor(scaling["short_factor"], dtype=torch.float64)
    inv = 1.0 / (short * raw["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = pos[:, None].double() * inv  # [s, d/2]
    cos, sin = ang.cos() * scale, ang.sin() * scale
    q = torch.randn(1, 2, 5, d, dtype=torch.float64)
    want = q.clone()
    for i in range(d // 2):  # pairs (x[i], x[i + d/2])
        a, b = q[..., i], q[..., i + d // 2]
        want[..., i] = a * cos[:, i] - b * sin[:, i]
        want[..., i + d // 2] = b * cos[:, i] + a * sin[:, i]
    exact = rope_from_hf(raw, layout="half", angle_dtype=torch.float64)
    got, _ = exact(q.float(), q.float(), pos)  # float32 rotation of float64 angles
    assert (got.double() - want).abs().max().item() < 1e-5


# --- item: mrope_position_ids' grids and mask --------------------------------------------------


def test_mrope_refuses_a_fractional_grid() -> None:
    from posenc.rotary import mrope_position_ids

    types = torch.tensor([[0, 1, 1, 1, 1, 0]])
    for grid in ([[1, 4.5, 4]], torch.tensor([[1.0, 4.0, 4.0]])):
        with pytest.raises(ValueError, match=r"image_grid_thw must be integers \(t, h, w\)"):
            mrope_position_ids("qwen2_vl", types, image_grid_thw=grid, spatial_merge_size=2)
    pos, _ = mrope_position_ids("qwen2_vl", types, image_grid_thw=[[1, 4, 4]], spatial_merge_size=2)
    assert pos.shape == (3, 1, 6)


def test_mrope_refuses_a_mask_of_other_values_and_takes_bool() -> None:
    from posenc.rotary import mrope_position_ids

    types = torch.tensor([[0, 0, 1, 1, 1, 1, 0]])
    kw: dict[str, Any] = {"image_grid_thw": [[1, 4, 4]], "spatial_merge_size": 2}
    mask = torch.tensor([[0, 1, 1, 1, 1, 1, 1]])
    with pytest.raises(ValueError, match=r"attention_mask must hold 0 \(padding\) and 1.*\[2\]"):
        mrope_position_ids("qwen2_vl", types, attention_mask=mask * 2, **kw)
    as_long = mrope_position_ids("qwen2_vl", types, attention_mask=mask, **kw)
    as_bool = mrope_position_ids("qwen2_vl", types, attention_mask=mask.bool(), **kw)
    assert all(torch.equal(a, b) for a, b in zip(as_long, as_bool, strict=True))


# --- item: DeepSeek-V4's module takes the whole head --------------------------------------------


@pytest.mark.parametrize("label", ["main", "compress", "indexer"])
@pytest.mark.parametrize("use_transformers", [True, False])
def test_deepseek_v4_module_rotates_the_trailing_slice_of_the_whole_head(
    label: str, use_transformers: bool
) -> None:
    """The published DeepSeek-V4-Flash config: ``rope(q, k)`` on 512-wide heads (128 for the
    indexer) equals transformers' deepseek_v4 ``apply_rotary_pos_emb`` (trailing slice) with
    its own rotary module's tables."""
    ds4 = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
    from _hf_corpus_paths import config_path
    from posenc.hf import rope_from_hf

    raw = json.loads(config_path("deepseek-v4-flash").read_text())
    obj = transformers.DeepseekV4Config.from_dict(dict(raw))
    their_label = ds4.DeepseekV4Indexer.rope_layer_type if label == "indexer" else label
    positions = torch.tensor([[0, 1, 7, 100, 5000, 70000]])
    cos_t, sin_t = ds4.DeepseekV4RotaryEmbedding(obj)(torch.zeros(1), positions, their_label)
    d = obj.index_head_dim if label == "indexer" else obj.head_dim
    rope = rope_from_hf(raw, label, use_transformers=use_transformers)
    assert (rope.head_dim, rope.rotary_dim) == (d, 64)
    q, k = torch.randn(1, 4, 6, d), torch.randn(1, 1, 6, d)
    got_q, got_k = rope(q, k, positions[0])
    for got, x in ((got_q, q), (got_k, k)):
        want = ds4.apply_rotary_pos_emb(x, cos_t, sin_t)
        assert (got - want).abs().max().item() <= 1e-5 * max(1.0, rope.attention_factor)
        assert torch.equal(got[..., : d - 64], x[..., : d - 64])  # the nope channels pass


# --- items: apply_posenc's refusals: an unsupported type, a user's subclass ---------------------


def _gptj_rope(q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, cfg: Any) -> Any:
    """transformers' own GPT-J rotation (modeling_gptj), on ``[b, h, s, d]``."""
    gptj = pytest.importorskip("transformers.models.gptj.modeling_gptj")
    r = cfg.rotary_dim
    sincos = gptj.create_sinusoidal_positions(cfg.n_positions, r)[pos]  # [b, s, r]
    sin, cos = torch.split(sincos, r // 2, dim=-1)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, 2)  # [b, s, h, d], as GPT-J's attention holds it
        rot = gptj.apply_rotary_pos_emb(x[..., :r], sin, cos)
        return torch.cat((rot, x[..., r:]), dim=-1).transpose(1, 2)

    return rotate(q), rotate(k)


def test_an_unsupported_type_is_told_what_still_works() -> None:
    from posenc.hf import rope_from_hf
    from posenc.testing import check_rope

    cfg = transformers.GPTJConfig(vocab_size=64, n_embd=64, n_layer=1, n_head=2, rotary_dim=16,
                                  n_positions=64)  # fmt: skip
    model = transformers.GPTJForCausalLM(cfg)
    with pytest.raises(ValueError, match="does not support model_type 'gptj'") as err:
        apply_posenc(model)
    for named in ("rope_from_hf(model.config)", "check_rope", "posenc inspect"):
        assert named in str(err.value)
    assert rope_from_hf(model.config).rotary_dim == 16  # each claim holds
    report = check_rope(lambda q, k, p, _: _gptj_rope(q, k, p, cfg), model.config,
                        max_position=cfg.n_positions - 1, dtypes=(torch.float32,))  # fmt: skip
    assert report.ok, report
    path = Path(__file__).parent / "data" / "hf_configs" / "llama-3.2-1b-instruct.json"
    assert runner.invoke(app, ["inspect", str(path)]).exit_code == 0
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2))
    with pytest.raises(ValueError, match="model_type 'gpt2'") as err:
        apply_posenc(gpt2)  # no RoPE: nothing of that kind to offer
    assert "rope_from_hf" not in str(err.value)


class _InheritsForward(transformers.models.llama.modeling_llama.LlamaAttention):
    """A user's subclass that adds state but keeps transformers' forward."""


class _OwnForward(transformers.models.llama.modeling_llama.LlamaAttention):
    """A user's subclass with a forward of its own (calling transformers')."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return super().forward(*args, **kwargs)


def _with_attention(cls: type) -> Any:
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_tiny_llama()).eval()
    for i, layer in enumerate(model.model.layers):
        sub = cls(model.config, i)
        sub.load_state_dict(layer.self_attn.state_dict())
        layer.self_attn = sub
    return model


def test_a_subclass_that_inherits_forward_is_patched() -> None:
    model = _with_attention(_InheritsForward)
    ids = torch.randint(0, 64, (1, 12))
    with torch.no_grad():
        want = model(ids).logits
        apply_posenc(model)
        got = model(ids).logits
    assert len(model.posenc_patch.attention) == 2  # was 0: the subclass was skipped silently
    assert all(isinstance(m, _InheritsForward) for m in model.posenc_patch.attention)
    assert torch.allclose(got, want, atol=1e-5, rtol=0)


def test_a_subclass_with_its_own_forward_is_named() -> None:
    model = _with_attention(_OwnForward)
    with (
        pytest.warns(UserWarning, match=r"left the layers of \['_OwnForward'\] unpatched"),
        pytest.raises(RuntimeError, match="found no attention layer"),
    ):
        apply_posenc(model)  # every attention layer is the user's: nothing to patch
    with pytest.raises(ValueError, match=r"\['_OwnForward'\] define their own forward"):
        apply_posenc(model, extension={"method": "self_extend", "group_size": 2,
                                       "neighbor_window": 4})  # fmt: skip
