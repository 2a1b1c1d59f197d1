"""Tiny transformers models for the tests, written once: a random causal LM of any model type
(:func:`tiny_lm`), the small BPE tokenizer trained on a real document (:func:`bpe_tokenizer`),
and the two saved as a model folder ``posenc extend`` reads (:func:`tiny_folder`).

transformers and tokenizers are imported inside the functions, so that a test file that skips
without them (``pytest.importorskip``) may import this module first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

#: The tests' tiny decoder: two layers of four query heads over two KV heads (GQA) on a width
#: of 64, a 96-wide MLP, a vocabulary of 64, trained at 32 tokens. A test's keys override them.
TINY_SIZES: dict[str, Any] = {
    "vocab_size": 64,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32,
}

#: :data:`TINY_SIZES` for the parity tests of a patched model: head_dim 16, a vocabulary of 97,
#: trained at 64 tokens, and large weights, so that attention scores are large and a wrong
#: rotation moves the logits.
PARITY_SIZES: dict[str, Any] = {
    **TINY_SIZES,
    "vocab_size": 97,
    "head_dim": 16,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
    "initializer_range": 0.3,
}


def tiny_lm(model_type: str = "llama", *, attn: str | None = None, **config: Any) -> Any:
    """A random causal LM of ``model_type`` (torch seed 0) in eval mode: :data:`TINY_SIZES`
    and ``config``, read by the model type's own config class; ``attn`` sets the attention
    implementation (default: transformers' choice)."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.CONFIG_MAPPING[model_type](**{**TINY_SIZES, **config})
    if attn is not None:
        cfg._attn_implementation = attn
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def bpe_tokenizer(vocab: int = 320, text: str | None = None) -> Any:
    """A byte-level BPE tokenizer of ``vocab`` tokens (``<s>``, ``</s>`` among them, as BOS and
    EOS) trained on ``text``, default the first 20,000 characters of the default perplexity
    document."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if text is None:
        from posenc.extend.measures.perplexity import default_documents

        text = default_documents(1)[0].read_text()[:20000]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([text], trainer)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>"
    )


def tiny_folder(path: Path, trained: int, model_type: str = "llama", **config: Any) -> Path:
    """:func:`tiny_lm` trained at ``trained`` tokens on :func:`bpe_tokenizer`'s vocabulary,
    saved with that tokenizer in ``path`` as ``posenc extend`` reads a model folder."""
    tok = bpe_tokenizer()
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    model = tiny_lm(
        model_type, vocab_size=len(tok), max_position_embeddings=trained, **ids, **config
    )
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
