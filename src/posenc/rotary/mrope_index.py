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
from collections.abc import Sequence
from typing import Any

import torch

from .._checks import check_positive_int
from .mrope_omni import _interleave_chunked, _interleave_merged, _omni_row, _omni_text_only
from .mrope_rows import (
    _KIND,
    TOKEN_TYPES,
    MRoPEPositionLayout,
    _indexed_images_row,
    _Inputs,
    _interleaved_runs_row,
    _is_text,
    _runs,
)

__all__ = [
    "MROPE_POSITION_LAYOUTS",
    "MROPE_POSITION_MODEL_TYPES",
    "TOKEN_TYPES",
    "MRoPEPositionLayout",
    "mrope_position_ids",
]

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
        if any(isinstance(v, bool) or not isinstance(v, int) for v in g):  # 4.5 is no patch count
            raise ValueError(f"each entry of {name} must be integers (t, h, w), got {g!r}")
        t, h, w = (check_positive_int(f"{name} {a}", v) for a, v in zip("thw", g, strict=True))
        out.append((t, h, w))
    return out


def _check_merge(
    images: list[tuple[int, int, int]], videos: list[tuple[int, int, int]], m: int
) -> None:
    for what, grids in (("image", images), ("video", videos)):
        for g in grids:
            if g[1] % m or g[2] % m:
                raise ValueError(
                    f"{what} grid h, w ({g[1]}, {g[2]}) must be divisible by spatial_merge_size {m}"
                )


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
    inp = _inputs(
        layout, token_types, attention_mask, image_grid_thw, video_grid_thw, spatial_merge_size,
        positions_per_second, seconds_per_grid, temporal_merge_size, seconds_per_chunk, num_axes,
    )  # fmt: skip
    lay = inp.layout
    if "text_only" in lay.extras and not inp.images and not inp.videos:  # Omni: its other path
        return lay.extras["text_only"](token_types, attention_mask, lay.dtype)
    out, deltas = _number_rows(inp, token_types, attention_mask)
    _check_consumed(inp)
    return out, deltas


def _inputs(
    layout: str,
    token_types: torch.Tensor,
    attention_mask: torch.Tensor | None,
    image_grid_thw: torch.Tensor | Sequence[Sequence[int]] | None,
    video_grid_thw: torch.Tensor | Sequence[Sequence[int]] | None,
    spatial_merge_size: int,
    positions_per_second: float | None,
    seconds_per_grid: torch.Tensor | Sequence[float] | None,
    temporal_merge_size: int,
    seconds_per_chunk: float | None,
    num_axes: int,
) -> _Inputs:
    """:func:`mrope_position_ids`' arguments checked (in this order) and gathered."""
    given = {
        "positions_per_second": positions_per_second is not None,
        "seconds_per_grid": seconds_per_grid is not None,
        "temporal_merge_size": temporal_merge_size != 1,
        "seconds_per_chunk": seconds_per_chunk is not None,
        "num_axes": num_axes != 4,
    }
    lay = _layout(layout, given)
    _check_token_types(lay, token_types, attention_mask)
    m = check_positive_int("spatial_merge_size", spatial_merge_size)
    axes = 3
    if lay.name == "indexed_images":
        axes = check_positive_int("num_axes", num_axes)
        if axes < 3:
            raise ValueError(f"indexed_images needs num_axes >= 3, got {num_axes}")
    images = _grids(image_grid_thw, "image_grid_thw")
    videos = _grids(video_grid_thw, "video_grid_thw")
    _check_merge(images, videos, m)
    seconds = _seconds(seconds_per_grid, len(videos))
    _check_rate(positions_per_second)
    if lay.split_video_frames:  # one (1, h, w) grid per frame, as the frames are separate runs
        videos = [(1, h, w) for t, h, w in videos for _ in range(t)]
    return _Inputs(
        lay, images, videos, seconds, m, check_positive_int("temporal_merge_size", temporal_merge_size),
        positions_per_second, seconds_per_chunk, axes,
    )  # fmt: skip


def _layout(layout: str, given: dict[str, bool]) -> MRoPEPositionLayout:
    """The entry that ``layout`` (a layout name or a ``model_type``) names, checked against the
    options ``given``."""
    model_type = layout if layout in MROPE_POSITION_MODEL_TYPES else None
    name = MROPE_POSITION_MODEL_TYPES.get(layout, layout)
    if name not in MROPE_POSITION_LAYOUTS:
        raise ValueError(
            f"layout must be one of {sorted(MROPE_POSITION_LAYOUTS)} or a model_type of "
            f"{sorted(MROPE_POSITION_MODEL_TYPES)}, got {layout!r}"
        )
    lay = MROPE_POSITION_LAYOUTS[name]
    unused = sorted(k for k, v in given.items() if v and k not in lay.options)
    if unused:
        raise ValueError(
            f"layout {name!r} does not read {unused}; it reads {sorted(lay.options) or 'none'}"
        )
    for option, source in _REQUIRED.get(model_type or "", {}).items():
        if not given[option]:
            raise ValueError(f"{model_type} needs {option} (its config's {source})")
    return lay


def _check_token_types(
    lay: MRoPEPositionLayout, token_types: Any, attention_mask: torch.Tensor | None
) -> None:
    """``token_types [b, s]``: an integer tensor of the types ``lay`` numbers; ``attention_mask``
    of its shape."""
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
    if attention_mask is not None:  # 2 is neither a token nor padding
        values = set(attention_mask.unique().tolist()) - {0, 1}
        if values:
            raise ValueError(
                f"attention_mask must hold 0 (padding) and 1 (tokens) or be bool, got values "
                f"{sorted(values)}"
            )
    bad = sorted(set(token_types.unique().tolist()) - lay.token_types)
    if bad:
        raise ValueError(
            f"layout {lay.name!r} numbers token types {sorted(lay.token_types)} "
            f"({', '.join(_KIND[t] for t in sorted(lay.token_types))}), got {bad}"
        )


def _seconds(
    seconds_per_grid: torch.Tensor | Sequence[float] | None, n_videos: int
) -> torch.Tensor | None:
    """``seconds_per_grid`` as a ``[n_videos]`` tensor (python floats -> float32, as the
    processor), checked finite and > 0."""
    if seconds_per_grid is None:
        return None
    seconds = torch.as_tensor(seconds_per_grid)
    if seconds.dim() != 1 or seconds.shape[0] != n_videos:
        raise ValueError(
            f"seconds_per_grid must have one entry per video ({n_videos}), got shape "
            f"{list(seconds.shape)}"
        )
    if not bool(torch.isfinite(seconds).all()) or not bool((seconds > 0).all()):
        raise ValueError(f"seconds_per_grid must be finite and > 0, got {seconds.tolist()}")
    return seconds


def _check_rate(positions_per_second: float | None) -> None:
    if positions_per_second is not None and not (
        not isinstance(positions_per_second, bool)
        and isinstance(positions_per_second, (int, float))
        and math.isfinite(positions_per_second)
        and positions_per_second > 0
    ):
        raise ValueError(
            f"positions_per_second must be a finite number > 0, got {positions_per_second!r}"
        )


def _row_runs(lay: MRoPEPositionLayout, types: list[int]) -> list[tuple[Any, int]]:
    """The runs of one row; Omni: text runs, and non-text runs with their types spelled out."""
    if lay.name.startswith("audio_"):
        return [
            (0, len(g)) if is_text else (tuple(g), len(g))
            for is_text, g in ((k, list(g)) for k, g in itertools.groupby(types, _is_text))
        ]
    return _runs(types)


def _number_rows(
    inp: _Inputs, token_types: torch.Tensor, attention_mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``position_ids [a, b, s]`` (the layout's pad value at padding) and ``deltas [b, 1]``, one
    row at a time."""
    lay, device = inp.layout, token_types.device
    b, s = token_types.shape
    out = torch.full((inp.num_axes, b, s), lay.pad, dtype=lay.dtype, device=device)
    deltas = []
    for i in range(b):
        keep = (
            attention_mask[i].to(device) == 1
            if attention_mask is not None
            else torch.ones(s, dtype=torch.bool, device=device)
        )
        types = token_types[i][keep].tolist()
        runs = _row_runs(lay, types)
        if not types:
            deltas.append(torch.zeros((), dtype=lay.dtype))
            continue
        row = lay.row(inp, runs, device)  # [a, n]
        out[:, i, keep] = row.to(lay.dtype)
        deltas.append(row.max().to(lay.dtype) + 1 - len(types))
    return out, torch.stack(deltas).view(b, 1).to(device)


def _check_consumed(inp: _Inputs) -> None:
    """Every grid was the grid of a run."""
    for kind, grids, at in ((1, inp.images, inp.image_at), (2, inp.videos, inp.video_at)):
        if at != len(grids):
            name = "image_grid_thw" if kind == 1 else "video_grid_thw"
            raise ValueError(
                f"{name} has {len(grids)} grids but token_types has {at} {_KIND[kind]} runs"
                + (" (frames)" if kind == 2 and inp.layout.split_video_frames else "")
            )
