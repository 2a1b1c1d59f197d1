"""transformers >= 5.25 depends on ``kernels``, whose ``@use_kernel_forward_from_hub`` turns a
modeling module's ``apply_rotary_pos_emb`` into an instance of a ``Func`` module: posenc reads
the function inside it (its name and signature) and still patches the model."""

import inspect

import pytest
import torch
import transformers
from torch import nn
from transformers.models.llama import modeling_llama

from posenc.hf import apply_posenc
from posenc.hf.patch import HALF, fused_rotation
from posenc.hf.shadow import plain_function

kernels = pytest.importorskip("kernels")


def rotate(q, k, cos, sin, unsqueeze_dim=1):  # type: ignore[no-untyped-def]
    return q * cos.unsqueeze(unsqueeze_dim), k * sin.unsqueeze(unsqueeze_dim)


def test_the_function_inside_kernels_wrapper_is_found() -> None:
    wrapped = kernels.use_kernel_forward_from_hub("posenc_test_rotate")(rotate)
    assert isinstance(wrapped, nn.Module) and not hasattr(wrapped, "__name__")
    assert plain_function(wrapped) is rotate
    assert plain_function(rotate) is rotate  # a plain function (transformers < 5.25) as it is
    stand_in = fused_rotation(HALF, wrapped)
    assert stand_in.__name__ == "posenc_rotate"
    assert stand_in.__doc__ is not None and stand_in.__doc__.endswith(f"{__name__}.rotate.")


def test_a_wrapper_without_the_function_is_refused_by_name() -> None:
    class Func(nn.Module):
        kernel_layer_name = "posenc_test_other"

        def forward(self, *args):  # type: ignore[no-untyped-def]
            return args

    with pytest.raises(RuntimeError, match=r"cannot find the function inside .*Func"):
        plain_function(Func())


def test_the_installed_llama_function_and_the_patched_model() -> None:
    stock = modeling_llama.apply_rotary_pos_emb
    plain = plain_function(stock)
    assert plain.__name__ == "apply_rotary_pos_emb"
    assert list(inspect.signature(plain).parameters)[:4] == ["q", "k", "cos", "sin"]
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2)  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        want = model(ids).logits
        got = apply_posenc(model)(ids).logits
    assert len(model.posenc_patch.attention) == 2
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
