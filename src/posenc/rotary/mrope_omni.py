"""The Qwen2.5-Omni and Qwen3-Omni row builders of :mod:`posenc.rotary.mrope_index`: text, image,
video, audio runs, and a video with its audio interleaved (in chunks or merged by time)."""

from __future__ import annotations

from typing import Any

import torch

from .mrope_rows import _KIND, _check_count, _Inputs, _next_grid, _text


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
    for r, (kind, n) in enumerate(runs):
        start = parts[-1].max() + 1 if parts else 0
        if kind == 0:
            # Qwen2.5-Omni gives a video's two start markers (vision, audio) one position and
            # its two end markers one position.
            paired = bool(lay.extras.get("paired_markers"))
            dup_first = paired and r > 0 and mixed[r - 1]
            dup_last = paired and r + 1 < len(runs) and mixed[r + 1]
            parts.append(_omni_text(lay.name, n, dup_first, dup_last, start, device))
            continue
        if r == 0 or r + 1 == len(runs):  # runs alternate: text (markers) must be on each side
            raise ValueError(
                f"{lay.name}: each image, video or audio run must be framed by its start and end "
                f"marker tokens (text, token type 0), got one at the "
                f"{'start' if r == 0 else 'end'} of a row"
            )
        parts += _omni_media(inp, kind, n, start, device)
    return torch.cat([p.to(lay.dtype) for p in parts], dim=1)  # [3, n]


def _omni_text(
    name: str, n: int, dup_first: bool, dup_last: bool, start: Any, device: torch.device
) -> torch.Tensor:
    """A text run's positions ``[3, n]`` from ``start``; ``dup_first``/``dup_last``: its first
    (last) two tokens are a video-with-audio's paired markers and share one position."""
    need = 2 * dup_first + 2 * dup_last
    if n < need:
        raise ValueError(
            f"{name}: a video with its audio must be framed by two start and two end "
            f"marker tokens (text), got a text run of {n} beside it"
        )
    step = torch.ones(n, dtype=torch.long)
    step[0] = 0
    if dup_first:
        step[1] = 0
    if dup_last:
        step[-1] = 0
    return (torch.cumsum(step, 0) + start).to(device).expand(3, n)  # [3, n]


def _omni_media(
    inp: _Inputs, kind: Any, n: int, start: Any, device: torch.device
) -> list[torch.Tensor]:
    """The positions of a non-text run of ``n`` tokens (an image, a video, an audio clip, or a
    video with its audio: ``kind`` spells out its token types) from ``start``."""
    lay = inp.layout
    kinds = set(kind) if isinstance(kind, tuple) else {kind}
    if kinds == {3}:
        return [_text(start, n, 3, device).to(lay.dtype)]
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
    block = _omni_vision(inp, v, grid, start, device)
    if kinds != {2, 3}:
        _check_count(v, n, block.shape[1], grid, "t * h/m * w/m")
        return [block]
    audio_len = n - block.shape[1]
    if audio_len < 1:
        raise ValueError(
            f"a video with its audio has {n} tokens, not more than its grid {grid}'s "
            f"{block.shape[1]} video tokens"
        )
    audio = _text(start, audio_len, 3, torch.device("cpu")).to(lay.dtype).to(device)
    pieces, order = lay.extras["interleave"](inp, block, audio, start)
    if order != list(kind):
        raise ValueError(
            f"{lay.name}: the video and audio tokens of a video with its audio are not in "
            "the order its positions interleave them"
        )
    return [p for p in pieces if p.shape[1]]


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
