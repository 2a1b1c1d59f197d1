"""M-RoPE position ids of multimodal sequences: the ``get_rope_index`` rules of each model family.

An M-RoPE model numbers each token on three (HunYuan-VL: four) axes. Text tokens carry the same
position on every axis; vision tokens carry their grid coordinates; how the grid is laid out,
where text resumes after it, and how audio interleaves with video differ per family. Each way is
an entry of :data:`MROPE_POSITION_LAYOUTS` (its run builder and its options), and
:data:`MROPE_POSITION_MODEL_TYPES` names the entry of each transformers ``model_type``::

    interleaved_runs            Qwen2-VL, Qwen2.5-VL, PaddleOCR-VL, ERNIE-4.5-VL
    interleaved_runs_per_frame  Qwen3-VL, Qwen3.5, GLM-4V, GLM-OCR, Cosmos-3 Edge
    newline_runs                HunYuan-V4-VL
    audio_chunked               Qwen2.5-Omni
    audio_merged                Qwen3-Omni
    indexed_images              HunYuan-VL (XD-RoPE)

Tokens are described by ``token_types [b, s]`` (:data:`TOKEN_TYPES`: 0 text, 1 image, 2 video,
3 audio; Hugging Face's ``mm_token_type_ids`` plus audio); a maximal run of one type is one image
or video (the grids, listed over the whole batch in order, are consumed one per run). Start and
end markers (``<|vision_start|>`` ...) are text tokens.

Example, ``interleaved_runs`` with one image of merged grid ``(1, 2, 2)`` after 2 text tokens::

    token_types  0  0  1  1  1  1  0
    T            0  1  2  2  2  2  4      text resumes at start + max(h, w) = 2 + 2
    H            0  1  2  2  3  3  4
    W            0  1  2  3  2  3  4

These functions prepare inputs (as a processor does): they read token types and grids on the
host and are not meant for a traced forward.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .._checks import check_positive_int

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


def _omni_vision(
    inp: _Inputs, kind: int, grid: tuple[int, int, int], start: Any, device: torch.device
) -> torch.Tensor:
    """Qwen2.5/3-Omni's vision positions ``[3, t*h*w]``: ``T = start + i_t * s * r`` (``s`` seconds
    per grid of the video, 1 for an image; ``r`` positions per second), ``H, W`` the merged
    grid's rows and columns from ``start``. Qwen2.5-Omni floors ``T`` (long), Qwen3-Omni keeps it
    in float32."""
    t, h, w = grid[0], grid[1] // inp.merge, grid[2] // inp.merge
    r = inp.per_second
    steps = torch.arange(t)
    if kind == 1:
        temporal = steps * 1 * r  # type: ignore[operator]  # as transformers: an image's frames are r apart
    else:
        temporal = steps * inp.seconds[inp.video_at - 1].cpu().float() * r  # type: ignore
    if inp.layout.dtype == torch.long:
        temporal = temporal.long().float().long()  # [t]; transformers: long -> torch.Tensor -> long
        hh = torch.arange(h).view(1, -1, 1).expand(t, -1, w).flatten()
        ww = torch.arange(w).view(1, 1, -1).expand(t, h, -1).flatten()
    else:
        temporal = temporal.float()
        hh = torch.arange(h).view(1, -1, 1).expand(t, -1, w).flatten().float()
        ww = torch.arange(w).view(1, 1, -1).expand(t, h, -1).flatten().float()
    tt = temporal.view(-1, 1).expand(-1, h * w).flatten()
    return (torch.stack([tt, hh, ww]) + start).to(device)  # [3, t*h*w]


def _chunks(values: torch.Tensor, per_chunk: int, start: Any) -> list[tuple[int, int]]:
    """Qwen2.5-Omni's ``get_chunked_index``: ``(begin, end)`` slices of the increasing
    ``values`` cut where ``values - start`` reaches the next multiple of ``per_chunk``."""
    out, begin, chunk = [], 0, 1
    for i, v in enumerate(values.tolist()):
        if v - int(start) >= chunk * per_chunk:
            out.append((begin, i))
            begin, chunk = i, chunk + 1
    out.append((begin, len(values)))
    return out


def _interleave_chunked(
    inp: _Inputs, video: torch.Tensor, audio: torch.Tensor, start: Any
) -> tuple[list[torch.Tensor], list[int]]:
    """Qwen2.5-Omni: video and audio cut in chunks of ``seconds_per_chunk`` seconds, then video
    chunk 0, audio chunk 0, video chunk 1, ..."""
    if inp.seconds_per_chunk is None:
        raise ValueError(
            "audio_chunked needs seconds_per_chunk (the config's seconds_per_chunk) for a video "
            "with its audio"
        )
    per_chunk = int(inp.per_second * inp.seconds_per_chunk)  # type: ignore[operator]
    v_chunks, a_chunks = _chunks(video[0], per_chunk, start), _chunks(audio[0], per_chunk, start)
    parts, types = [], []
    for j in range(max(len(v_chunks), len(a_chunks))):
        for chunks, src, kind in ((v_chunks, video, 2), (a_chunks, audio, 3)):
            if j < len(chunks):
                b, e = chunks[j]
                parts.append(src[:, b:e])
                types += [kind] * (e - b)
    return parts, types


def _interleave_merged(
    inp: _Inputs, video: torch.Tensor, audio: torch.Tensor, start: Any
) -> tuple[list[torch.Tensor], list[int]]:
    """Qwen3-Omni: video and audio tokens merged by temporal position (video first on ties)."""
    parts, types, i, j = [], [], 0, 0
    while i < video.shape[1] and j < audio.shape[1]:
        if video[0, i] <= audio[0, j]:
            parts.append(video[:, i : i + 1])
            types.append(2)
            i += 1
        else:
            parts.append(audio[:, j : j + 1])
            types.append(3)
            j += 1
    parts += [video[:, i:], audio[:, j:]]
    types += [2] * (video.shape[1] - i) + [3] * (audio.shape[1] - j)
    return parts, types


def _omni_row(inp: _Inputs, runs: list[tuple[Any, int]], device: torch.device) -> torch.Tensor:
    """Qwen2.5-Omni and Qwen3-Omni: each run (text, image, video, audio, or a video with its audio)
    starts at the previous run's largest position + 1."""
    lay = inp.layout
    if inp.per_second is None:
        raise ValueError(
            f"{lay.name} needs positions_per_second (the config's position_id_per_seconds)"
        )
    parts: list[torch.Tensor] = []
    mixed = [isinstance(k, tuple) and len(set(k)) > 1 for k, _ in runs]

    def start() -> Any:
        return parts[-1].max() + 1 if parts else 0

    for r, (kind, n) in enumerate(runs):
        if kind == 0:
            # Qwen2.5-Omni gives a video's two start markers (vision, audio) one position and
            # its two end markers one position.
            dup_first = lay.extras.get("paired_markers") and r > 0 and mixed[r - 1]
            dup_last = lay.extras.get("paired_markers") and r + 1 < len(runs) and mixed[r + 1]
            need = 2 * bool(dup_first) + 2 * bool(dup_last)
            if n < need:
                raise ValueError(
                    f"{lay.name}: a video with its audio must be framed by two start and two end "
                    f"marker tokens (text), got a text run of {n} beside it"
                )
            step = torch.ones(n, dtype=torch.long)
            step[0] = 0
            if dup_first:
                step[1] = 0
            if dup_last:
                step[-1] = 0
            parts.append((torch.cumsum(step, 0) + start()).to(device).expand(3, n))  # [3, n]
            continue
        kinds = set(kind) if isinstance(kind, tuple) else {kind}
        if r == 0 or r + 1 == len(runs):  # runs alternate: text (markers) must be on each side
            raise ValueError(
                f"{lay.name}: each image, video or audio run must be framed by its start and end "
                f"marker tokens (text, token type 0), got one at the "
                f"{'start' if r == 0 else 'end'} of a row"
            )
        if kinds == {3}:
            parts.append(_text(start(), n, 3, device).to(lay.dtype))
            continue
        if kinds not in ({1}, {2}, {2, 3}):
            raise ValueError(
                f"{lay.name}: a run of non-text tokens must be one image, one video, one audio or "
                f"a video with its audio, got token types {sorted(kinds)}"
            )
        v = 1 if kinds == {1} else 2
        grid = _next_grid(inp, v)
        if v == 2 and inp.seconds is None:
            raise ValueError(f"{lay.name} needs seconds_per_grid for each video")
        if grid[1] % inp.merge or grid[2] % inp.merge:
            raise ValueError(
                f"{_KIND[v]} grid h, w ({grid[1]}, {grid[2]}) must be divisible by "
                f"spatial_merge_size {inp.merge}"
            )
        s = start()
        block = _omni_vision(inp, v, grid, s, device)
        if kinds != {2, 3}:
            _check_count(v, n, block.shape[1], grid, "t * h/m * w/m")
            parts.append(block)
            continue
        audio_len = n - block.shape[1]
        if audio_len < 1:
            raise ValueError(
                f"a video with its audio has {n} tokens, not more than its grid {grid}'s "
                f"{block.shape[1]} video tokens"
            )
        audio = _text(s, audio_len, 3, torch.device("cpu")).to(lay.dtype).to(device)
        pieces, order = lay.extras["interleave"](inp, block, audio, s)
        if order != list(kind):
            raise ValueError(
                f"{lay.name}: the video and audio tokens of a video with its audio are not in "
                "the order its positions interleave them"
            )
        parts += [p for p in pieces if p.shape[1]]
    return torch.cat([p.to(lay.dtype) for p in parts], dim=1)  # [3, n]


def _omni_text_only(
    token_types: torch.Tensor, attention_mask: torch.Tensor | None, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen2.5/3-Omni without images or videos (audio numbered as text): positions count the
    kept tokens, padding gets 1, and the deltas take padding's 1 into the largest position."""
    mask = torch.ones_like(token_types) if attention_mask is None else attention_mask
    mask = mask.to(token_types.device)
    pos = mask.to(dtype).cumsum(-1) - 1  # [b, s]
    pos = pos.masked_fill(mask == 0, 1).unsqueeze(0).expand(3, -1, -1)  # [3, b, s]
    deltas = pos.max(0)[0].max(-1, keepdim=True)[0] + 1 - mask.sum(-1, keepdim=True)  # [b, 1]
    return pos, deltas


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


# --- the tables ---------------------------------------------------------------------------------

_VL_OPTIONS = frozenset({"positions_per_second", "seconds_per_grid", "temporal_merge_size"})

#: Layout name -> entry. Each entry is exact to its family's ``get_rope_index`` in transformers 5.
MROPE_POSITION_LAYOUTS: dict[str, MRoPEPositionLayout] = {
    lay.name: lay
    for lay in (
        MRoPEPositionLayout(
            "interleaved_runs",
            "Qwen2-VL, Qwen2.5-VL (positions_per_second: tokens_per_second), PaddleOCR-VL, "
            "ERNIE-4.5-VL (temporal_merge_size)",
            _interleaved_runs_row,
            frozenset({0, 1, 2}),
            _VL_OPTIONS,
        ),
        MRoPEPositionLayout(
            "interleaved_runs_per_frame",
            "Qwen3-VL, Qwen3.5, GLM-4V, GLM-OCR, Cosmos-3 Edge: each video frame is its own run "
            "(frames separated by timestamp text)",
            _interleaved_runs_row,
            frozenset({0, 1, 2}),
            split_video_frames=True,
        ),
        MRoPEPositionLayout(
            "newline_runs",
            "HunYuan-V4-VL: a newline column per grid row, frames max(h, w + 1) apart",
            _interleaved_runs_row,
            frozenset({0, 1, 2}),
            vision="newline_grid",
        ),
        MRoPEPositionLayout(
            "audio_chunked",
            "Qwen2.5-Omni: audio and video in chunks of seconds_per_chunk",
            _omni_row,
            frozenset({0, 1, 2, 3}),
            frozenset({"positions_per_second", "seconds_per_grid", "seconds_per_chunk"}),
            pad=1,
            extras={
                "interleave": _interleave_chunked,
                "paired_markers": True,
                "text_only": _omni_text_only,
            },
        ),
        MRoPEPositionLayout(
            "audio_merged",
            "Qwen3-Omni: audio and video merged by temporal position, float32 positions",
            _omni_row,
            frozenset({0, 1, 2, 3}),
            frozenset({"positions_per_second", "seconds_per_grid"}),
            dtype=torch.float32,
            extras={"interleave": _interleave_merged, "text_only": _omni_text_only},
        ),
        MRoPEPositionLayout(
            "indexed_images",
            "HunYuan-VL: num_axes axes, the last three (width, height, image ordinal)",
            _indexed_images_row,
            frozenset({0, 1}),
            frozenset({"num_axes"}),
        ),
    )
}

#: transformers ``model_type`` -> layout name (the family whose ``get_rope_index`` it runs).
MROPE_POSITION_MODEL_TYPES: dict[str, str] = {
    **dict.fromkeys(
        ("qwen2_vl", "qwen2_5_vl", "paddleocr_vl", "ernie4_5_vl_moe"), "interleaved_runs"
    ),
    **dict.fromkeys(
        ("qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "glm4v", "glm4v_moe", "glm46v",
         "glm_ocr", "cosmos3_edge"),
        "interleaved_runs_per_frame",
    ),
    "hy_v4_vl": "newline_runs",
    "qwen2_5_omni": "audio_chunked", "qwen2_5_omni_thinker": "audio_chunked",
    "qwen3_omni_moe": "audio_merged", "qwen3_omni_moe_thinker": "audio_merged",
    "hunyuan_vl": "indexed_images",
}  # fmt: skip
# Options a model type cannot go without (its config's name in the error).
_REQUIRED = {"qwen2_5_vl": {"positions_per_second": "vision_config.tokens_per_second"}}


def _grids(grids: Any, name: str) -> list[tuple[int, int, int]]:
    if grids is None:
        return []
    rows = grids.tolist() if isinstance(grids, torch.Tensor) else [list(g) for g in grids]
    out = []
    for g in rows:
        if len(g) != 3:
            raise ValueError(f"each entry of {name} must be (t, h, w), got {g!r}")
        t, h, w = (check_positive_int(f"{name} {a}", int(v)) for a, v in zip("thw", g, strict=True))
        out.append((t, h, w))
    return out


def mrope_position_ids(
    layout: str,
    token_types: torch.Tensor,
    *,
    image_grid_thw: torch.Tensor | Sequence[Sequence[int]] | None = None,
    video_grid_thw: torch.Tensor | Sequence[Sequence[int]] | None = None,
    spatial_merge_size: int = 1,
    attention_mask: torch.Tensor | None = None,
    positions_per_second: float | None = None,
    seconds_per_grid: torch.Tensor | Sequence[float] | None = None,
    temporal_merge_size: int = 1,
    seconds_per_chunk: float | None = None,
    num_axes: int = 4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """M-RoPE ``position_ids`` of a batch of multimodal sequences, as the model's
    ``get_rope_index`` builds them.

    Args:
        layout: an entry of :data:`MROPE_POSITION_LAYOUTS` or a ``model_type`` of
            :data:`MROPE_POSITION_MODEL_TYPES` (``"qwen2_5_vl"``, ``"glm4v"``, ...).
        token_types: ``[b, s]`` integers of :data:`TOKEN_TYPES` (0 text, 1 image, 2 video,
            3 audio); each maximal run of one type is one image, video (frame) or audio clip.
        image_grid_thw, video_grid_thw: ``[n, 3]`` patch grids (t, h, w) before spatial merging,
            over the whole batch in order (the processor's ``image_grid_thw``).
        spatial_merge_size: ``m``, the vision config's ``spatial_merge_size``.
        attention_mask: ``[b, s]``, 1 for tokens and 0 for padding (padding gets the layout's
            pad value, left or right).
        positions_per_second: temporal positions per second of video: Qwen2.5-VL's
            ``tokens_per_second``, Omni's ``position_id_per_seconds``.
        seconds_per_grid: ``[n_videos]`` seconds per temporal patch (``second_per_grid_ts``).
        temporal_merge_size: ERNIE-4.5-VL's video frames merged per temporal position.
        seconds_per_chunk: Qwen2.5-Omni's audio/video chunk length for a video with its audio.
        num_axes: ``a`` for ``indexed_images`` (``len(mrope_section)``).

    Returns:
        ``position_ids [a, b, s]`` (``a = 3`` except ``indexed_images``; long, float32 for
        ``audio_merged``) and ``deltas [b, 1]`` (largest position + 1 - tokens, what
        transformers caches as ``rope_deltas`` to continue generation).

    >>> import torch
    >>> from posenc.rotary import mrope_position_ids
    >>> types = torch.tensor([[0, 0, 1, 1, 1, 1, 0]])
    >>> pos, delta = mrope_position_ids("qwen2_vl", types, image_grid_thw=[[1, 4, 4]],
    ...                                 spatial_merge_size=2)
    >>> pos[:, 0].tolist(), delta.tolist()
    ([[0, 1, 2, 2, 2, 2, 4], [0, 1, 2, 2, 3, 3, 4], [0, 1, 2, 3, 2, 3, 4]], [[-2]])
    """
    model_type = layout if layout in MROPE_POSITION_MODEL_TYPES else None
    name = MROPE_POSITION_MODEL_TYPES.get(layout, layout)
    if name not in MROPE_POSITION_LAYOUTS:
        raise ValueError(
            f"layout must be one of {sorted(MROPE_POSITION_LAYOUTS)} or a model_type of "
            f"{sorted(MROPE_POSITION_MODEL_TYPES)}, got {layout!r}"
        )
    lay = MROPE_POSITION_LAYOUTS[name]
    given = {
        "positions_per_second": positions_per_second is not None,
        "seconds_per_grid": seconds_per_grid is not None,
        "temporal_merge_size": temporal_merge_size != 1,
        "seconds_per_chunk": seconds_per_chunk is not None,
        "num_axes": num_axes != 4,
    }
    unused = sorted(k for k, v in given.items() if v and k not in lay.options)
    if unused:
        raise ValueError(
            f"layout {name!r} does not read {unused}; it reads {sorted(lay.options) or 'none'}"
        )
    for option, source in _REQUIRED.get(model_type or "", {}).items():
        if not given[option]:
            raise ValueError(f"{model_type} needs {option} (its config's {source})")
    if not isinstance(token_types, torch.Tensor) or token_types.dim() != 2:
        raise ValueError(
            f"token_types must be a [b, s] tensor, got {getattr(token_types, 'shape', token_types)!r}"
        )
    if token_types.dtype.is_floating_point or token_types.dtype == torch.bool:
        raise ValueError(f"token_types must be an integer tensor, got {token_types.dtype}")
    b, s = token_types.shape
    if attention_mask is not None and tuple(attention_mask.shape) != (b, s):
        raise ValueError(
            f"attention_mask must be [{b}, {s}] like token_types, got {list(attention_mask.shape)}"
        )
    bad = sorted(set(token_types.unique().tolist()) - lay.token_types)
    if bad:
        raise ValueError(
            f"layout {name!r} numbers token types {sorted(lay.token_types)} "
            f"({', '.join(_KIND[t] for t in sorted(lay.token_types))}), got {bad}"
        )
    m = check_positive_int("spatial_merge_size", spatial_merge_size)
    axes = 3
    if name == "indexed_images":
        axes = check_positive_int("num_axes", num_axes)
        if axes < 3:
            raise ValueError(f"indexed_images needs num_axes >= 3, got {num_axes}")
    images = _grids(image_grid_thw, "image_grid_thw")
    videos = _grids(video_grid_thw, "video_grid_thw")
    for what, grids in (("image", images), ("video", videos)):
        for g in grids:
            if g[1] % m or g[2] % m:
                raise ValueError(
                    f"{what} grid h, w ({g[1]}, {g[2]}) must be divisible by spatial_merge_size {m}"
                )
    seconds = None
    if seconds_per_grid is not None:
        seconds = torch.as_tensor(seconds_per_grid)  # python floats -> float32, as the processor
        if seconds.dim() != 1 or seconds.shape[0] != len(videos):
            raise ValueError(
                f"seconds_per_grid must have one entry per video ({len(videos)}), got shape "
                f"{list(seconds.shape)}"
            )
        if not bool(torch.isfinite(seconds).all()) or not bool((seconds > 0).all()):
            raise ValueError(f"seconds_per_grid must be finite and > 0, got {seconds.tolist()}")
    if positions_per_second is not None and not (
        not isinstance(positions_per_second, bool)
        and isinstance(positions_per_second, (int, float))
        and math.isfinite(positions_per_second)
        and positions_per_second > 0
    ):
        raise ValueError(
            f"positions_per_second must be a finite number > 0, got {positions_per_second!r}"
        )
    if lay.split_video_frames:  # one (1, h, w) grid per frame, as the frames are separate runs
        videos = [(1, h, w) for t, h, w in videos for _ in range(t)]
    inp = _Inputs(
        lay, images, videos, seconds, m, check_positive_int("temporal_merge_size", temporal_merge_size),
        positions_per_second, seconds_per_chunk, axes,
    )  # fmt: skip
    device = token_types.device
    if "text_only" in lay.extras and not images and not videos:  # Omni: transformers' other path
        return lay.extras["text_only"](token_types, attention_mask, lay.dtype)
    out = torch.full((axes, b, s), lay.pad, dtype=lay.dtype, device=device)
    deltas = []
    for i in range(b):
        keep = (
            attention_mask[i].to(device) == 1
            if attention_mask is not None
            else torch.ones(s, dtype=torch.bool, device=device)
        )
        types = token_types[i][keep].tolist()
        runs: list[tuple[Any, int]]
        if name.startswith("audio_"):  # text runs, and non-text runs with their types spelled out
            runs = [
                (0, len(g)) if is_text else (tuple(g), len(g))
                for is_text, g in ((k, list(g)) for k, g in itertools.groupby(types, _is_text))
            ]
        else:
            runs = _runs(types)
        if not types:
            deltas.append(torch.zeros((), dtype=lay.dtype))
            continue
        row = lay.row(inp, runs, device)  # [a, n]
        out[:, i, keep] = row.to(lay.dtype)
        deltas.append(row.max().to(lay.dtype) + 1 - len(types))
    for kind, grids, at in ((1, images, inp.image_at), (2, videos, inp.video_at)):
        if at != len(grids):
            name_ = "image_grid_thw" if kind == 1 else "video_grid_thw"
            raise ValueError(
                f"{name_} has {len(grids)} grids but token_types has {at} {_KIND[kind]} runs"
                + (" (frames)" if kind == 2 and lay.split_video_frames else "")
            )
    return out, torch.stack(deltas).view(b, 1).to(device)
