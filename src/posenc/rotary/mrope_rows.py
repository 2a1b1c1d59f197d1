"""The shared pieces of the M-RoPE position layouts (:mod:`posenc.rotary.mrope_index`): the token
types, one call's inputs, the layout entry, the run and grid helpers, and the row builders of the
vision-only families (interleaved runs, HunYuan-VL's indexed images)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

#: The token type numbers :func:`mrope_position_ids` reads (Hugging Face's ``mm_token_type_ids``).
TOKEN_TYPES: dict[str, int] = {"text": 0, "image": 1, "video": 2, "audio": 3}
_KIND = {v: k for k, v in TOKEN_TYPES.items()}


@dataclass
class _Inputs:
    """What one call of :func:`mrope_position_ids` was given, with the grid iterators shared by the
    rows of the batch (transformers lists images and videos over the whole batch)."""

    layout: MRoPEPositionLayout
    images: list[tuple[int, int, int]]
    videos: list[tuple[int, int, int]]
    seconds: torch.Tensor | None  # [n_videos]
    merge: int
    temporal_merge: int
    per_second: float | None
    seconds_per_chunk: float | None
    num_axes: int
    image_at: int = 0
    video_at: int = 0
    image_index: int = 0  # HunYuan-VL: the ordinal of an image over the whole batch


@dataclass(frozen=True)
class MRoPEPositionLayout:
    """One family's rule for numbering multimodal tokens (an entry of
    :data:`MROPE_POSITION_LAYOUTS`).

    ``row`` builds the positions ``[a, n]`` of one unpadded row from its runs; ``token_types`` the
    types it numbers; ``options`` the keyword arguments of :func:`mrope_position_ids` it reads
    beyond the grids; ``pad``: the value transformers writes at padded positions; ``dtype`` of the
    positions (Qwen3-Omni keeps fractional temporal positions in float32).
    """

    name: str
    models: str
    row: Callable[[_Inputs, list[tuple[Any, int]], torch.device], torch.Tensor]
    token_types: frozenset[int]
    options: frozenset[str] = frozenset()
    pad: int = 0
    dtype: torch.dtype = torch.long
    split_video_frames: bool = False
    vision: str = "grid"  # which grid numbering: "grid" or "newline_grid"
    extras: Mapping[str, Any] = field(default_factory=dict)


# --- run helpers --------------------------------------------------------------------------------


def _runs(types: list[int]) -> list[tuple[int, int]]:
    """``(type, length)`` of each maximal run of one token type."""
    return [(k, len(list(g))) for k, g in itertools.groupby(types)]


def _is_text(t: int) -> bool:
    return t == 0


def _next_grid(inp: _Inputs, kind: int) -> tuple[int, int, int]:
    grids, at = (inp.images, inp.image_at) if kind == 1 else (inp.videos, inp.video_at)
    name = "image_grid_thw" if kind == 1 else "video_grid_thw"
    if at >= len(grids):
        raise ValueError(
            f"token_types has more {_KIND[kind]} runs than {name} has grids ({len(grids)}); each "
            f"run of {_KIND[kind]} tokens is one {_KIND[kind]}"
        )
    if kind == 1:
        inp.image_at += 1
    else:
        inp.video_at += 1
    return grids[at]


def _check_count(kind: int, got: int, want: int, grid: tuple[int, int, int], how: str) -> None:
    if got != want:
        raise ValueError(
            f"a run of {got} {_KIND[kind]} tokens does not match its grid (t, h, w) = {grid}: "
            f"{how} = {want} tokens"
        )


def _text(start: torch.Tensor | int, n: int, axes: int, device: torch.device) -> torch.Tensor:
    return (torch.arange(n, device=device) + start).expand(axes, n)  # [a, n]: same on every axis


def _grid_thw(
    t: int, h: int, w: int, start: int, interval: Any, device: torch.device
) -> torch.Tensor:
    """Qwen2-VL's ``get_vision_position_ids``: ``[3, t*h*w]`` in (t, h, w) order over the merged
    grid; ``T = start + floor(i_t * interval)``, ``H = start + i_h``, ``W = start + i_w``."""
    temporal = (torch.arange(t, device=device) * interval).long()  # [t]
    grid = torch.meshgrid(
        temporal, torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij"
    )  # 3 x [t, h, w]
    return torch.stack(grid).reshape(3, -1) + start  # [3, t*h*w]


def _newline_grid(t: int, h: int, w: int, start: int, device: torch.device) -> torch.Tensor:
    """HunYuan-V4-VL's grid: one extra (newline) column per row, frames ``max(h, w + 1)`` apart;
    ``T = start + i_t * max(h, w + 1)``, ``H = T + i_h``, ``W = T + i_w`` -> ``[3, t*h*(w+1)]``."""
    temporal = torch.arange(t, device=device) * max(h, w + 1)  # [t]
    tt, hh, ww = torch.meshgrid(
        temporal, torch.arange(h, device=device), torch.arange(w + 1, device=device), indexing="ij"
    )  # 3 x [t, h, w + 1]
    return torch.stack((tt, hh + tt, ww + tt)).reshape(3, -1) + start  # [3, t*h*(w+1)]


# --- row builders (one per family) --------------------------------------------------------------


def _interleaved_runs_row(
    inp: _Inputs, runs: list[tuple[Any, int]], device: torch.device
) -> torch.Tensor:
    """Qwen2/2.5/3-VL, GLM-4V, ERNIE-4.5-VL, HunYuan-V4-VL: text ``p, p+1, ...``; a vision run at
    ``p``, after which text resumes at ``p + max(h, w) / m`` (HunYuan-V4-VL: the run's largest
    position + 1)."""
    lay, m = inp.layout, inp.merge
    parts, pos = [], 0
    for kind, n in runs:
        if kind == 0:
            parts.append(_text(pos, n, 3, device))
            pos += n
            continue
        t, h, w = _next_grid(inp, kind)
        if lay.vision == "newline_grid":
            _check_count(kind, n, t * (h // m) * (w // m + 1), (t, h, w), "t * h/m * (w/m + 1)")
            block = _newline_grid(t, h // m, w // m, pos, device)
            pos = int(block.max()) + 1
        else:
            tm = inp.temporal_merge if kind == 2 else 1
            if t % tm:
                raise ValueError(
                    f"video grid t = {t} must be divisible by temporal_merge_size {tm}"
                )
            _check_count(kind, n, (t // tm) * (h // m) * (w // m), (t, h, w), "t/tm * h/m * w/m")
            interval: Any = 1
            if kind == 2 and inp.per_second is not None:  # Qwen2.5-VL: tokens_per_second * s
                sec = inp.seconds[inp.video_at - 1] if inp.seconds is not None else 1
                interval = inp.per_second * sec
            block = _grid_thw(t // tm, h // m, w // m, pos, interval, device)
            pos += max(h, w) // m
        parts.append(block)
    return torch.cat(parts, dim=1)  # [3, n]


def _indexed_images_row(
    inp: _Inputs, runs: list[tuple[Any, int]], device: torch.device
) -> torch.Tensor:
    """HunYuan-VL's XD-RoPE: every token has its sequence index on every axis; an image's grid
    tokens (``h/m`` rows of ``w/m + 1``, a newline column) carry (width, height, image ordinal) on
    the last three axes. An image run may include its start and end tokens (grid + 2)."""
    a, m = inp.num_axes, inp.merge
    n_all = sum(n for _, n in runs)
    pos = torch.arange(n_all, device=device).view(1, -1).expand(a, -1).clone()  # [a, n]
    at = 0
    for kind, n in runs:
        if kind == 1:
            t, h, w = _next_grid(inp, 1)
            rows, cols = torch.meshgrid(
                torch.arange(h // m, device=device),
                torch.arange(w // m + 1, device=device),
                indexing="ij",
            )  # 2 x [h/m, w/m + 1]
            tokens = rows.numel()
            if n not in (tokens, tokens + 2):
                raise ValueError(
                    f"a run of {n} image tokens does not match its grid (t, h, w) = {(t, h, w)}: "
                    f"h/m * (w/m + 1) = {tokens} tokens, or {tokens + 2} with its start and end"
                )
            b = at + (n - tokens) // 2
            pos[a - 3, b : b + tokens] = cols.flatten()
            pos[a - 2, b : b + tokens] = rows.flatten()
            pos[a - 1, b : b + tokens] = inp.image_index
            inp.image_index += 1
        at += n
    return pos
