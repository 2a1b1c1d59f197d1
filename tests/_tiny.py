"""Tiny models for the tests, written once: a random transformers causal LM of any model type
(:func:`tiny_lm`; DeepSeek-V4's keys, :data:`DEEPSEEK_V4_TINY`), the small BPE tokenizer trained
on a real document (:func:`bpe_tokenizer`), the two saved as a model folder ``posenc extend``
reads (:func:`tiny_folder`), and a lab grid of tiny cells (:func:`tiny_lab_config`).

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

#: A tiny DeepSeek-V4 (``DeepseekV4Config`` keys): one layer of each attention kind (sliding,
#: compressed sparse, heavily compressed), hash and routed MoE, YaRN on half of each head.
DEEPSEEK_V4_TINY: dict[str, Any] = dict(
    vocab_size=64, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=3,
    num_attention_heads=4, head_dim=32, q_lora_rank=32, n_routed_experts=4, num_experts_per_tok=2,
    o_groups=2, o_lora_rank=16, index_n_heads=2, index_head_dim=16, index_topk=4, sliding_window=8,
    partial_rotary_factor=0.5, max_position_embeddings=256,
    layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    mlp_layer_types=["hash_moe", "moe", "moe"], attn_implementation="eager",
    rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                     "beta_fast": 32, "beta_slow": 1},
)  # fmt: skip


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


def tiny_lab_config(
    corpus_dir: Path, encodings: tuple[str, ...] = ("none", "learned"), **kw: Any
) -> Any:
    """A lab grid small enough for a test (``preset="test"``): ``encodings`` on a one-layer model
    of width 32 trained 6 steps at 16 bytes of ``corpus_dir``'s text, evaluated at 1x and 2x,
    a checkpoint every 2 steps; ``kw``: other :class:`~posenc.lab.cells.presets.LabConfig`
    fields."""
    from dataclasses import replace

    from posenc.lab.cells import presets as P

    return replace(
        P.LabConfig(),
        preset="test",
        encodings=tuple(encodings),
        train_len=16,
        model=P.ModelShape(dim=32, num_layers=1, num_heads=2),
        train=P.TrainConfig(steps=6, batch_size=4, warmup_steps=2),
        data=P.DataConfig(source="text", path=str(corpus_dir)),
        eval=P.EvalConfig(lengths=("1x", "2x"), tokens=256, batch_tokens=128, curve_points=8),
        ckpt_every=2,
        **kw,
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
