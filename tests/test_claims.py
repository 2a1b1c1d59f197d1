"""What the project says must be true (DESIGN.md: claims are generated or tested): the READMEs'
list of reversal-blind encodings against the demo's own verdicts, every scheme they call
buildable by name builds, the run time they state, and Attention refusing an encoding it would
silently ignore."""

from __future__ import annotations

import pytest
import torch

from posenc import Attention, ModelConfig, TransformerLM, build, names


@pytest.mark.parametrize("name", names("absolute"))
def test_attention_refuses_absolute_encodings(name: str) -> None:
    # Inside attention an absolute encoding would do nothing: the layer would equal NoPE.
    enc = build(name, dim=32, num_heads=4)
    with pytest.raises(ValueError, match="absolute encoding: it adds position to the token emb"):
        Attention(32, 4, encoding=enc)
    with pytest.raises(ValueError, match="TransformerLM applies it there"):
        Attention(32, 4, encoding=enc, backend="sdpa")
    # Where it belongs it still works: TransformerLM adds it to the embeddings.
    model = TransformerLM(ModelConfig(vocab_size=7, dim=32, num_heads=4, encoding=name))
    assert model.absolute is not None
    assert model(torch.zeros(1, 5, dtype=torch.long)).shape == (1, 5, 7)


def test_attention_takes_none_and_nope() -> None:
    x = torch.randn(1, 5, 32)
    torch.manual_seed(0)
    a = Attention(32, 4)
    torch.manual_seed(0)
    b = Attention(32, 4, encoding=build("none", dim=32, num_heads=4))
    torch.testing.assert_close(a(x), b(x))
