"""Key-token perplexity (LongPPL, Fang et al. ICLR 2025) in ``posenc extend --longppl``.

The numerics against references written here: the truncated losses against one separate forward
per token of exactly the context the authors' windows give it (and of exactly ``trunc_len``
tokens where that is the same), the key-token rule against hand-made losses at each comparison's
boundary, LongPPL against hand-made vectors. Then the study end to end on a tiny Llama folder:
rows, a rerun that recomputes nothing, the report's table, and one-line refusals.
"""

from __future__ import annotations

import math

import pytest
import torch
import transformers

from posenc.extend.evaluate import token_nll
from posenc.extend.longppl import (
    key_positions,
    key_token_mask,
    key_token_perplexity,
    plain_perplexity,
    positions_mask,
    short_context_nll,
    short_windows,
)

TRUNC, WINDOW = 32, 8


@pytest.fixture(scope="module")
def tiny() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg).eval()


def _loss_after(model: torch.nn.Module, context: torch.Tensor, target: torch.Tensor) -> float:
    """``-log p(target | context)`` from the model's full logits (float64 log-softmax)."""
    with torch.no_grad():
        logits = model(input_ids=context[None]).logits[0, -1].double()
    return float(-torch.log_softmax(logits, -1)[target])


def _ids(length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 50, (1, length), generator=torch.Generator().manual_seed(seed))


def test_windows_are_the_authors() -> None:
    # range(0, L - trunc, window); the last window shortened to the end
    assert short_windows(61, 32, 8) == [(0, 8), (8, 8), (16, 8), (24, 5)]
    assert short_windows(64, 32, 8) == [(0, 8), (8, 8), (16, 8), (24, 8)]
    assert short_windows(33, 32, 8) == [(0, 1)]
    assert short_windows(32, 32, 8) == [] and short_windows(10, 32, 8) == []


@pytest.mark.parametrize("length", [64, 61])
def test_each_position_gets_its_windows_context(tiny: torch.nn.Module, length: int) -> None:
    """Position ``p >= trunc`` is predicted from ``ids[s : p]`` with ``s = p - trunc - j``,
    ``j = (p - trunc) % window``: ``trunc + j`` tokens; positions below ``trunc``: NaN."""
    ids = _ids(length)
    got = short_context_nll(tiny, ids, TRUNC, WINDOW)
    assert got.dtype == torch.float32 and got.shape == (length - 1,)
    assert torch.isnan(got[: TRUNC - 1]).all() and not torch.isnan(got[TRUNC - 1 :]).any()
    for p in range(TRUNC, length):
        j = (p - TRUNC) % WINDOW
        want = _loss_after(tiny, ids[0, p - TRUNC - j : p], ids[0, p])
        assert got[p - 1].item() == pytest.approx(want, abs=1e-4), p


def test_exactly_trunc_tokens_at_each_windows_first_position(tiny: torch.nn.Module) -> None:
    """Where the window gives exactly ``trunc`` tokens (``p = trunc + k window``) the loss is
    that of a forward of exactly the previous ``trunc`` tokens; elsewhere the context is longer
    and the loss differs from that reference."""
    ids = _ids(64)
    got = short_context_nll(tiny, ids, TRUNC, WINDOW)
    exact = {p: _loss_after(tiny, ids[0, p - TRUNC : p], ids[0, p]) for p in range(TRUNC, 64)}
    firsts = range(TRUNC, 64, WINDOW)
    for p in firsts:
        assert got[p - 1].item() == pytest.approx(exact[p], abs=1e-4), p
    others = [abs(got[p - 1].item() - exact[p]) for p in exact if p not in firsts]
    assert max(others) > 1e-3  # the longer context is seen: the two schemes are not the same


def test_full_and_short_agree_where_the_context_is_the_same(tiny: torch.nn.Module) -> None:
    ids = _ids(64)
    full, short = token_nll(tiny, ids), short_context_nll(tiny, ids, TRUNC, WINDOW)
    # the first window starts at 0: its positions see the whole prefix either way
    assert torch.allclose(full[TRUNC - 1 : TRUNC - 1 + WINDOW], short[TRUNC - 1 : TRUNC - 1 + WINDOW],
                          atol=1e-4)  # fmt: skip
    assert short_context_nll(tiny, ids, 64, WINDOW).isnan().all()  # no truncated context at all


def test_key_token_rule_at_each_boundary() -> None:
    t = torch.tensor
    # full < beta (2) and short - full > alpha (2), both strict; NaN never key
    full = t([1.0, 2.0, 1.999, 1.5, 1.5, 2.5, 0.5, 1.0])
    short = t([4.0, 9.0, 9.0, 3.5, 3.5001, 10.0, 2.4, math.nan])
    want = [True, False, True, False, True, False, False, False]
    assert key_token_mask(full, short).tolist() == want
    # another alpha and beta move both boundaries
    assert key_token_mask(t([1.0, 1.0]), t([2.0, 2.5]), alpha=1.0, beta=1.5).tolist() == [
        False,
        True,
    ]
    assert key_token_mask(t([1.5]), t([9.0]), beta=1.5).tolist() == [False]
    with pytest.raises(ValueError, match="one shape"):
        key_token_mask(t([1.0]), t([1.0, 2.0]))


def test_key_token_perplexity_by_length() -> None:
    nll = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])  # L = 8: tokens at positions 1..7
    mask = positions_mask([3, 6], 7)
    assert key_positions(mask) == [3, 6]
    values, counts = key_token_perplexity(nll, mask, [3, 4, 6, 7, 8])
    assert values[3] is None and counts[3] == 0  # positions 1, 2: none key
    assert values[4] == pytest.approx(math.exp(3.0)) and counts[4] == 1
    assert values[6] == pytest.approx(math.exp(3.0))  # position 6 is not < 6
    assert values[7] == pytest.approx(math.exp(4.5)) and counts[8] == 2
    assert plain_perplexity(nll, [3, 8]) == pytest.approx({3: math.exp(1.5), 8: math.exp(4.0)})
    with pytest.raises(ValueError, match="outside"):
        key_token_perplexity(nll, mask, [9])
    with pytest.raises(ValueError, match="outside"):
        positions_mask([0], 7)
