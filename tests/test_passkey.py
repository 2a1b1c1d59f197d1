"""Passkey retrieval: the Landmark Attention / LongLoRA prompt over bytes, scoring by teacher
forcing against a per-prefix loop, and the grid with stub models that know the key (100%) or
guess digits (10% per digit)."""

import pytest
import torch
from torch import nn

from posenc import ModelConfig, TransformerLM
from posenc.lab.evaluation.passkey import (
    FILLER,
    QUESTION,
    TASK,
    passkey_grid,
    passkey_sample,
    score_passkey,
)

DIGITS = set(b"0123456789")


def test_sample_is_the_landmark_prompt() -> None:
    s = passkey_sample(400, 0.5, key="40213")
    assert s.tokens.shape == (400,) and s.tokens.dtype == torch.int64 and s.key == "40213"
    lines = s.text.split("\n")
    assert lines[0] == TASK
    assert lines[2] == "The pass key is 40213. Remember it. 40213 is the pass key."
    assert lines[4] == f"{QUESTION} 40213"
    assert lines[1].startswith("The grass is green.") and lines[3].startswith("The grass")
    assert abs(len(lines[1]) - len(lines[3])) <= 1  # depth 0.5: the filler split in half
    assert (FILLER + " " + FILLER).startswith(lines[1])
    assert s.text[s.needle_start :].startswith("The pass key is 40213.")
    assert s.text[s.answer_start :] == "40213"


@pytest.mark.parametrize("task_description", [True, False])
def test_depth_places_the_key_line(task_description: bool) -> None:
    start = len(TASK) + 1 if task_description else 0
    first = passkey_sample(300, 0.0, key="11111", task_description=task_description)
    last = passkey_sample(300, 1.0, key="11111", task_description=task_description)
    assert first.needle_start == start + 1  # after an empty filler line
    assert last.text[last.needle_start :].startswith("The pass key is 11111. Remember it.")
    assert last.text.endswith("is the pass key.\n\nWhat is the pass key? The pass key is 11111")
    depths = [passkey_sample(600, d, key="1").needle_start for d in (0.1, 0.3, 0.6, 0.9)]
    assert depths == sorted(depths) and len(set(depths)) == 4


def test_samples_are_deterministic_with_a_generator() -> None:
    a = passkey_sample(300, 0.3, generator=torch.Generator().manual_seed(5))
    b = passkey_sample(300, 0.3, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.tokens, b.tokens) and len(a.key) == 5 and a.key.isdigit()


class KnowsTheKey(nn.Module):
    """An induction stub: at byte i it finds the latest earlier occurrence of the last 8 bytes
    and predicts the byte that followed it (causal: reads tokens[: i + 1] only)."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        b, s = tokens.shape
        logits = torch.zeros(b, s, 256)
        for r in range(b):
            seq = bytes(tokens[r].tolist())
            for i in range(8, s):
                at = seq.rfind(seq[i - 7 : i + 1], 0, i)
                if at >= 0:
                    logits[r, i, seq[at + 8]] = 1.0
        return logits


class GuessesDigits(nn.Module):
    """Random logits over the ten digit bytes (others -inf): 10% right per digit."""

    def __init__(self) -> None:
        super().__init__()
        self.g = torch.Generator().manual_seed(1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = torch.full((*tokens.shape, 256), -torch.inf)
        logits[..., 48:58] = torch.rand(*tokens.shape, 10, generator=self.g)
        return logits


def test_grid_with_a_model_that_knows_the_key_is_perfect() -> None:
    grid = passkey_grid(KnowsTheKey(), [260, 400, 700], [0.0, 0.5, 1.0], trials=4)
    assert grid.digit_accuracy.shape == grid.key_accuracy.shape == (3, 3)
    assert (grid.digit_accuracy == 1.0).all() and (grid.key_accuracy == 1.0).all()


def test_grid_with_a_guessing_model_is_near_ten_percent() -> None:
    grid = passkey_grid(
        GuessesDigits(), [120, 200], [0.0, 0.25, 0.5, 0.75, 1.0], trials=40,
        task_description=False, batch_size=16,
    )  # fmt: skip
    assert 0.07 < grid.digit_accuracy.mean() < 0.13  # 2000 digits: 10% +- 0.7% (1 sd)
    assert grid.key_accuracy.mean() < 0.01  # 1e-5 per key


def test_teacher_forcing_equals_a_per_prefix_loop() -> None:
    """Each digit judged from the model run on the prefix before it, one prefix at a time."""
    model = TransformerLM(ModelConfig(vocab_size=256, dim=16, num_layers=1, num_heads=2)).eval()
    samples = [passkey_sample(150, d, key="31415", task_description=False) for d in (0.2, 0.8)]
    tokens = torch.stack([s.tokens for s in samples])
    got = score_passkey(model, tokens, 5)
    for r, s in enumerate(samples):
        for j in range(5):
            prefix = s.tokens[: s.answer_start + j][None]
            guess = model(prefix)[0, -1].argmax()
            assert bool(got[r, j]) == (int(guess) == int(s.tokens[s.answer_start + j]))


def test_grid_restores_training_mode_and_is_deterministic() -> None:
    model = TransformerLM(ModelConfig(vocab_size=256, dim=16, num_layers=1, num_heads=2))
    model.train()
    a = passkey_grid(model, [130], [0.5], trials=3, task_description=False)
    b = passkey_grid(model, [130], [0.5], trials=3, task_description=False)
    assert model.training and (a.digit_accuracy == b.digit_accuracy).all()


def test_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match=r"length must be >= \d+ bytes .*task_description=False"):
        passkey_sample(100, 0.5)
    with pytest.raises(ValueError, match="depth"):
        passkey_sample(400, 1.5)
    with pytest.raises(ValueError, match="key must be a string of digits"):
        passkey_sample(400, 0.5, key="12a45")
    with pytest.raises(ValueError, match="trials"):
        passkey_grid(KnowsTheKey(), [300], [0.5], trials=0)
