"""Llama-3 scaling with ``high_freq_factor < low_freq_factor``, read as transformers reads it.

transformers' config validation only warns (``high_freq_factor field must be greater than
low_freq_factor``) and ``_compute_llama3_parameters`` runs: the smoothing band
``L / high <= wavelength <= L / low`` is empty, so wavelengths above ``L / low`` are divided by
``factor`` and the others kept. posenc warns and gives the same frequencies (bit for bit), cos/sin
and rotated q/k; the planted fault (the factors put back in order, i.e. smoothing anyway) moves them.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
llama = pytest.importorskip("transformers.models.llama.modeling_llama")

from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

from posenc.hf import rope_from_hf  # noqa: E402
from posenc.rotary import RotaryEmbedding  # noqa: E402

CASES = [(4.0, 1.0), (2.0, 1.5), (8.0, 0.5)]  # (low_freq_factor, high_freq_factor)


def _params(low: float, high: float) -> dict[str, float | int | str]:
    return {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": low,
            "high_freq_factor": high, "original_max_position_embeddings": 512}  # fmt: skip


def _config(low: float, high: float) -> object:
    return transformers.LlamaConfig(
        hidden_size=256, num_attention_heads=2, max_position_embeddings=4096,
        rope_parameters=_params(low, high),
    )  # fmt: skip


@pytest.mark.parametrize(("low", "high"), CASES)
@pytest.mark.parametrize("form", ["object", "dict", "dict without transformers"])
def test_frequencies_and_rotations_equal_transformers(low: float, high: float, form: str) -> None:
    config = _config(low, high)
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")  # [64]
    plain = 1.0 / (500000.0 ** (torch.arange(0, 128, 2).float() / 128))
    assert (want == plain / 8).any() and (want == plain).any()  # both kinds, none smoothed
    source = config if form == "object" else {"model_type": "llama", **config.to_dict()}
    with pytest.warns(UserWarning, match="high_freq_factor"):
        rope = rope_from_hf(source, use_transformers=form != "dict without transformers")
    got, _ = rope.frequencies()
    assert torch.equal(got.float(), want)
    positions = torch.tensor([[0, 1, 100, 511, 512, 4095, 16383]])  # to 4x max
    q, k = torch.randn(1, 2, 7, 128), torch.randn(1, 1, 7, 128)
    cos, sin = llama.LlamaRotaryEmbedding(config)(q, positions)
    theirs = llama.apply_rotary_pos_emb(q, k, cos, sin)
    ours = rope(q, k, positions[0])
    assert max((a - b).abs().max().item() for a, b in zip(ours, theirs, strict=True)) <= 1e-4


def test_smoothing_anyway_is_caught() -> None:
    """Planted fault: the factors swapped into order (low 1, high 4) smooth a band."""
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](_config(4.0, 1.0), "cpu")
    scaling = {k: v for k, v in _params(1.0, 4.0).items() if k != "rope_theta"}
    fault = RotaryEmbedding(128, 500000.0, scaling=scaling)
    assert (fault.frequencies()[0].float() - want).abs().max().item() > 1e-4
