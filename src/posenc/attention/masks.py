"""Masks of the execution paths: the boolean keep-mask (SDPA, explicit) and FlexAttention's
block masks, with the cache of causal block masks every layer shares.

Causality is by index: query ``i`` of ``s`` sees key ``j`` of ``t`` when ``j <= t - s + i``.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from .._checks import check_positive_int


def causal_block_mask(s: int, t: int, device: torch.device, block: int = 128) -> Any:
    """The causal FlexAttention ``BlockMask`` of ``s`` queries over ``t`` keys, from block indices.

    ``create_block_mask`` evaluates the mask entry by entry, an ``[s, t]`` tensor (10 GiB at
    32k); causality by index is known per block in closed form instead. Query block ``qb``
    (rows ``qb*B .. min(qb*B+B, s) - 1``) sees key ``j`` when ``j <= row + (t - s)``, so key
    block ``kb`` is *full* when its last key is visible to the block's first row, *partial* when
    its first key is visible to the block's last row, and skipped otherwise (a ragged last
    block is never full)::

        s = t = 4 blocks:   F . . .      F full (no mask_mod call), P partial, . skipped
                            F P . .      (diagonal blocks are partial)
                            F F P .
                            F F F P
    """
    from torch.nn.attention.flex_attention import BlockMask

    offset = t - s
    nq, nk = -(-s // block), -(-t // block)
    first_row = torch.arange(nq, device=device) * block  # [nq]
    last_row = torch.clamp(first_row + block, max=s) - 1
    kb = torch.arange(nk, device=device)  # [nk]
    first_key, last_key = kb * block, torch.clamp(kb * block + block, max=t) - 1
    full = last_key[None, :] <= first_row[:, None] + offset  # [nq, nk]
    # A ragged last block stays partial, as create_block_mask has it: its padding is masked.
    full &= ((last_row - first_row + 1) == block)[:, None] & ((last_key - first_key + 1) == block)
    partial = (first_key[None, :] <= last_row[:, None] + offset) & ~full  # [nq, nk]

    def indices(sel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Selected key blocks first, in ascending order: [1, 1, nq] counts, [1, 1, nq, nk] indices.
        order = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True)
        return sel.sum(-1).to(torch.int32)[None, None], order.to(torch.int32)[None, None]

    def causal(
        b: torch.Tensor, h: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor
    ) -> torch.Tensor:
        return ki <= qi + offset

    kv_num, kv_idx = indices(partial)
    full_num, full_idx = indices(full)
    # torch 2.5's from_kv_blocks takes no seq_lengths (its flex_attention reads them off q, k).
    takes_lengths = "seq_lengths" in inspect.signature(BlockMask.from_kv_blocks).parameters
    lengths: dict[str, Any] = {"seq_lengths": (s, t)} if takes_lengths else {}
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block, mask_mod=causal, **lengths
    )


class BlockMaskCache:
    """Causal FlexAttention block masks keyed by ``(s, t, device)``; least recently used goes first.

    A causal block mask depends on nothing but the query and key lengths (causality is by index:
    query ``i`` of ``s`` sees key ``j`` of ``t`` when ``j <= t - s + i``) and the device, which
    make the key, so an entry can never be stale. Masks that depend on data (``attn_mask``) are
    built per call and never cached. Every :class:`Attention` shares one module-level cache
    unless given its own, so the layers of a model build each mask once.
    """

    def __init__(self, maxsize: int = 8) -> None:
        self.maxsize = check_positive_int("maxsize", maxsize)
        self._masks: OrderedDict[tuple[int, int, str], Any] = OrderedDict()

    def causal(self, s: int, t: int, device: torch.device) -> Any:
        """The ``BlockMask`` of the causal mask of ``s`` queries over ``t`` keys."""
        key = (s, t, str(torch.device(device)))
        mask = self._masks.get(key)
        if mask is None:
            mask = causal_block_mask(s, t, device)
            self._masks[key] = mask
            if len(self._masks) > self.maxsize:
                self._masks.popitem(last=False)
        else:
            self._masks.move_to_end(key)
        return mask

    def clear(self) -> None:
        self._masks.clear()

    def __len__(self) -> int:
        return len(self._masks)


DEFAULT_BLOCK_MASK_CACHE = BlockMaskCache()


def _check_attn_mask(attn_mask: torch.Tensor, batch: int, s: int, t: int) -> None:
    if attn_mask.dtype != torch.bool:
        raise TypeError(f"attn_mask must be bool (True = attend), got {attn_mask.dtype}")
    if attn_mask.dim() == 2:
        if tuple(attn_mask.shape) != (batch, t):
            raise ValueError(
                f"a 2-D attn_mask must be a key padding mask [batch, keys]={[batch, t]}, "
                f"got {list(attn_mask.shape)}"
            )
    elif attn_mask.dim() == 4:
        if attn_mask.shape[-2:] != (s, t):
            raise ValueError(
                f"a 4-D attn_mask must end in [s, t]={[s, t]}, got {list(attn_mask.shape)}"
            )
    else:
        raise ValueError(
            f"attn_mask must be [b, t] or [b, 1|h, s, t], got shape {tuple(attn_mask.shape)}"
        )


def flex_block_mask(
    s: int,
    t: int,
    causal: bool,
    attn_mask: torch.Tensor | None,
    batch: int,
    device: torch.device,
    cache: BlockMaskCache,
) -> Any:
    """The FlexAttention ``BlockMask`` (or None: attend everywhere) equal to :func:`build_mask`.

    Without ``attn_mask`` the causal mask comes from ``cache``. With one the mask depends on data,
    so it is built per call (a boolean pass over ``[b, s, t]``, never a float bias), and rows
    that would see no key are opened to every key, as :func:`build_mask` does, so both paths
    give the same output on them too (FlexAttention alone would give zeros there).
    """
    if attn_mask is None:
        return cache.causal(s, t, device) if causal else None
    from torch.nn.attention.flex_attention import create_block_mask

    _check_attn_mask(attn_mask, batch, s, t)
    heads: int | None = None
    if attn_mask.dim() == 2:
        mask_mod = _padding_mask_mod(attn_mask.to(device), s, t, causal)
    else:
        # A dense user mask exists already: combine it with causality once, densely.
        dense = build_mask(s, t, causal, attn_mask, batch, device)
        assert dense is not None
        dense = dense.expand(batch, -1, s, t)  # [b, 1|h, s, t]
        if dense.shape[1] == 1:
            flat = dense[:, 0]  # [b, s, t]

            def dense_mod(
                b: torch.Tensor, h: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor
            ) -> torch.Tensor:
                return flat[b, qi, ki]

            mask_mod = dense_mod
        else:
            heads = dense.shape[1]

            def dense_head_mod(
                b: torch.Tensor, h: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor
            ) -> torch.Tensor:
                return dense[b, h, qi, ki]

            mask_mod = dense_head_mod
    return create_block_mask(_clamped(mask_mod, s, t), batch, heads, s, t, device=device)


def _clamped(mask_mod: Callable[..., Any], s: int, t: int) -> Callable[..., Any]:
    """``mask_mod`` with query and key indices clamped to ``s - 1`` and ``t - 1``.

    torch 2.5's ``create_block_mask`` calls it on lengths rounded up to its block size (128), so
    an index past the mask tensors would raise; the padding's values only sort blocks into full,
    partial or empty, and a padded key or query repeats the last real one's value.
    """

    def mod(b: torch.Tensor, h: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor) -> torch.Tensor:
        return mask_mod(b, h, qi.clamp(max=s - 1), ki.clamp(max=t - 1))

    return mod


def _padding_mask_mod(pad: torch.Tensor, s: int, t: int, causal: bool) -> Callable[..., Any]:
    """The ``mask_mod`` of a key padding mask ``pad [b, t]`` (and causality), with rows that see
    no key opened to every key as :func:`build_mask` does."""
    offset = t - s
    if causal:
        # Query i sees keys 0 .. i + offset: it sees some key iff one of those is kept.
        seen = pad.long().cumsum(dim=1) > 0  # [b, t]: any kept key at or before j
        last = (torch.arange(s, device=pad.device) + offset).clamp(0, t - 1)  # [s]
        row_open = ~seen[:, last]  # [b, s]
    else:
        row_open = (~pad.any(dim=1, keepdim=True)).expand(pad.shape[0], s)  # [b, s]

    def keep_mod(
        b: torch.Tensor, h: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor
    ) -> torch.Tensor:
        keep = pad[b, ki]
        if causal:
            keep = keep & (ki <= qi + offset)
        return keep | row_open[b, qi]

    return keep_mod


def build_mask(
    s: int,
    t: int,
    causal: bool,
    attn_mask: torch.Tensor | None,
    batch: int,
    device: torch.device,
) -> torch.Tensor | None:
    """Boolean keep-mask ``[s, t]`` or ``[b, 1|h, s, t]`` (True = attend), or None for no mask.

    ``attn_mask`` is a key padding mask ``[b, t]`` or a full mask ``[b, 1|h, s, t]``, bool.
    Rows that would see no key at all (a left-padding query under a causal mask) are opened to
    every key: their output is ignored, and a fully masked row would give NaN that leaks into
    the next layer through ``0 * NaN``.
    """
    keep: torch.Tensor | None = None
    if causal:
        i = torch.arange(s, device=device)[:, None]
        j = torch.arange(t, device=device)[None, :]
        keep = j <= i + (t - s)  # [s, t]
    if attn_mask is not None:
        _check_attn_mask(attn_mask, batch, s, t)
        user = (
            attn_mask[:, None, None, :] if attn_mask.dim() == 2 else attn_mask
        )  # [b, 1|h, s|1, t]
        keep = user if keep is None else (keep & user)  # [b, 1|h, s, t]
        keep = keep | ~keep.any(dim=-1, keepdim=True)
    return keep
