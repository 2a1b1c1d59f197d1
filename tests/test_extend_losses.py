"""``token_losses``: the loss of each token from one body forward and a chunked head equals the
full-logits path (``model(ids).logits``) and a naive one-prefix-per-token reference, Gemma-3's
final logit soft cap included; a range of positions scores just those; bad input is refused in
one line."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import transformers

from posenc.extend.measures.perplexity import perplexity_at, token_losses, token_nll

VOCAB, LENGTH = 96, 40


def _llama() -> Any:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg).eval()


def _gemma3(cap: float | None = 1.5) -> Any:
    """A tiny Gemma-3 text model: sliding and full layers, a soft cap small enough to bend
    most logits (``tanh(x / cap) * cap``) of a head scaled up to give logits of a few units."""
    torch.manual_seed(0)
    cfg = transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=64,
        final_logit_softcapping=cap,
    )  # fmt: skip
    model = transformers.Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():  # logits of a few units (initialised ones are ~0.1: no cap bends them)
        model.lm_head.weight.mul_(50.0)
    return model


MODELS = {"llama": _llama, "gemma3_softcap": _gemma3}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request: pytest.FixtureRequest) -> Any:
    return MODELS[request.param]()


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, LENGTH), generator=torch.Generator().manual_seed(1))


def _full_logits_nll(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """The path before chunking: ``[L, vocab]`` logits at once from the model's own forward."""
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float()  # [L - 1, vocab], soft cap applied
    return torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")


def _naive_nll(model: Any, ids: torch.Tensor, positions: list[int]) -> list[float]:
    """``-log p(ids[t] | ids[:t])`` from a forward of the prefix alone, token by token."""
    out = []
    with torch.no_grad():
        for t in positions:
            logits = model(ids[:, :t]).logits[0, -1].double()  # [vocab]
            out.append(-float(torch.log_softmax(logits, -1)[ids[0, t]]))
    return out


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_equals_the_full_logits_path(model: Any, chunk: int) -> None:
    ids = _ids()
    nll = token_nll(model, ids, chunk=chunk)
    want = _full_logits_nll(model, ids)
    assert nll.dtype == torch.float32 and nll.shape == (LENGTH - 1,)
    assert (nll - want).abs().max() <= 1e-5
    for length in (16, LENGTH):
        got, ref = perplexity_at(nll, length, 8), perplexity_at(want, length, 8)
        assert abs(got - ref) <= 1e-6 * ref


def test_equals_a_naive_prefix_reference(model: Any) -> None:
    ids = _ids()
    positions = [1, 2, 9, 23, LENGTH - 1]
    nll = token_nll(model, ids, chunk=5)
    want = _naive_nll(model, ids, positions)
    for t, w in zip(positions, want, strict=True):
        assert math.isclose(float(nll[t - 1]), w, abs_tol=1e-5), t


def test_a_range_scores_just_those_tokens(model: Any) -> None:
    ids = _ids()
    every = token_nll(model, ids)
    part = token_losses(model, ids, start=17, end=33, chunk=4)
    assert part.shape == (16,)
    assert (part - every[16:32]).abs().max() <= 1e-5
    tail = token_losses(model, ids, start=LENGTH - 3)
    assert (tail - every[-3:]).abs().max() <= 1e-5


def test_the_soft_cap_is_applied_as_transformers_applies_it() -> None:
    ids = _ids()
    capped, uncapped = _gemma3(1.5), _gemma3(None)  # the same weights (same seed)
    want = _full_logits_nll(capped, ids)
    assert (token_nll(capped, ids, chunk=6) - want).abs().max() <= 1e-5
    # planted fault: the cap left off changes the losses, so the check above has teeth
    assert (token_nll(uncapped, ids, chunk=6) - want).abs().max() > 1e-2


@pytest.mark.parametrize(
    ("ids", "kw", "match"),
    [
        (torch.zeros(LENGTH, dtype=torch.long), {}, "shape \\[1, L\\]"),
        (torch.zeros(2, LENGTH, dtype=torch.long), {}, "shape \\[1, L\\]"),
        (torch.zeros(1, 1, dtype=torch.long), {}, "L >= 2"),
        (torch.zeros(1, LENGTH), {}, "integer token ids"),
        (torch.zeros(1, LENGTH, dtype=torch.long), {"start": 0}, "1 <= start < end"),
        (torch.zeros(1, LENGTH, dtype=torch.long), {"start": 5, "end": 5}, "got start 5, end 5"),
        (torch.zeros(1, LENGTH, dtype=torch.long), {"end": LENGTH + 1}, f"L = {LENGTH}"),
        (torch.zeros(1, LENGTH, dtype=torch.long), {"chunk": 0}, "chunk >= 1"),
    ],
)
def test_bad_input_is_refused_in_one_line(ids: torch.Tensor, kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match) as err:
        token_losses(_llama(), ids, **kw)
    assert "\n" not in str(err.value)
