"""What a loaded model cannot take at all, checked before a study writes anything: a length
past its learned absolute position table (GPT-2's ``wpe``, OPT's ``embed_positions``), and a
token id past its input embedding (a tokenizer that is not the model's own).

Both fail deep inside the forward as ``IndexError: index out of range in self``; here they are
one line naming the model's limit and the option or file that went past it.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

#: Attribute names of learned absolute position tables in transformers' decoders.
_POSITION_TABLES = ("wpe", "embed_positions", "position_embeddings", "pos_emb")


def position_table_length(model: nn.Module) -> int | None:
    """The positions ``model``'s learned absolute position table holds (``nn.Embedding`` rows
    less OPT's offset of 2), or None for a model without one (rotary, ALiBi, NoPE)."""
    for parent in model.modules():
        for name in _POSITION_TABLES:
            table = parent.__dict__.get("_modules", {}).get(name)
            if isinstance(table, nn.Embedding):
                return int(table.num_embeddings) - int(getattr(table, "offset", 0))
    return None


def check_positions(model: nn.Module, longest: int, option: str) -> None:
    """Refuse ``longest`` tokens (asked by ``option``) on a model whose learned position table
    is shorter: no positional method extends a table of learned positions."""
    table = position_table_length(model)
    if table is not None and longest > table:
        kind = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise ValueError(
            f"{option} asks for {longest} tokens and this {kind} has learned absolute positions "
            f"for {table} tokens only (no method here extends a learned position table): ask "
            f"{table} tokens or fewer"
        )


def input_rows(model: nn.Module) -> int:
    """The rows of ``model``'s input embedding: every token id must be below it."""
    return int(model.get_input_embeddings().weight.shape[0])  # type: ignore[operator,union-attr]


def check_token_ids(ids: Iterable[int], rows: int, what: str) -> None:
    """Refuse ids of ``what`` (a document, a prompt) at or past ``rows``, the model's vocabulary."""
    top = max(ids, default=-1)
    if top >= rows:
        raise ValueError(
            f"{what} holds token id {top} and the model's vocabulary has {rows} ids (0-{rows - 1}):"
            " the tokenizer is not this model's; put the model's own tokenizer in its folder"
        )
