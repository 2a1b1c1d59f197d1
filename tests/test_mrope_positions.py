"""M-RoPE position ids against each model family's own ``get_rope_index`` in transformers.

Each case is a multimodal sequence written once as segments; the test spells it out as Hugging
Face inputs (``input_ids`` with the model's marker and placeholder tokens, ``mm_token_type_ids``,
grids, seconds per grid, audio lengths), runs the model class's ``get_rope_index`` on a stand-in
``self`` that carries only the config values it reads, and requires posenc's
:func:`~posenc.rotary.mrope_position_ids` to give the same integers (and the same ``rope_deltas``).
"""

from __future__ import annotations

import functools
import importlib
from types import SimpleNamespace
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc.rotary import (  # noqa: E402
    MROPE_POSITION_LAYOUTS,
    MROPE_POSITION_MODEL_TYPES,
    mrope_position_ids,
)

M = 2  # spatial_merge_size
TPS = 2  # Qwen2.5-VL tokens_per_second
TMERGE = 2  # ERNIE-4.5-VL temporal_merge_size
PPS = 25  # Omni position_id_per_seconds
CHUNK = 2  # Qwen2.5-Omni seconds_per_chunk
N_AXES = 4  # HunYuan-VL len(mrope_section)
# Token ids of the stand-in vocabulary (text tokens are 100 + i).
IMG, VID, AUD, VSTART, VEND, ASTART, AEND = 1, 2, 3, 4, 5, 6, 7

VL_TYPES = [t for t, lay in MROPE_POSITION_MODEL_TYPES.items() if lay.endswith("runs") or
            lay == "interleaved_runs_per_frame"]  # fmt: skip


def _hf_self(model_type: str) -> tuple[Any, Any]:
    """``(get_rope_index, stand-in self)`` of the model type's class."""
    base = model_type.removesuffix("_thinker")
    module = importlib.import_module(f"transformers.models.{base}.modeling_{base}")
    cls = next(  # the first class that defines it (Qwen3-Omni's talker has its own, later)
        c
        for c in vars(module).values()
        if isinstance(c, type) and c.__module__ == module.__name__ and "get_rope_index" in vars(c)
    )
    vision = SimpleNamespace(
        spatial_merge_size=M, tokens_per_second=TPS, temporal_merge_size=TMERGE
    )
    config = SimpleNamespace(
        vision_config=vision,
        text_config=SimpleNamespace(rope_parameters={"mrope_section": [8] * N_AXES}),
        audio_config=SimpleNamespace(n_window=50),
        image_token_id=IMG, video_token_id=VID, audio_token_id=AUD,
        vision_start_token_id=VSTART, audio_start_token_id=ASTART,
        position_id_per_seconds=PPS, seconds_per_chunk=CHUNK,
    )  # fmt: skip
    me = SimpleNamespace(config=config, spatial_merge_size=M)
    for name in ("get_vision_position_ids", "get_llm_pos_ids_for_vision", "get_chunked_index"):
        if hasattr(cls, name):
            setattr(me, name, functools.partial(getattr(cls, name), me))
    return functools.partial(cls.get_rope_index, me), me


# --- sequences ----------------------------------------------------------------------------------


def _vision_tokens(model_type: str, kind: str, grid: tuple[int, int, int]) -> list[list[int]]:
    """The placeholder runs of one image/video: one run, or one per frame (per-frame layouts)."""
    t, h, w = grid
    layout = MROPE_POSITION_MODEL_TYPES[model_type]
    cols = w // M + (1 if layout in ("newline_runs", "indexed_images") else 0)
    per_frame = (h // M) * cols
    if kind == "video" and layout == "interleaved_runs_per_frame":
        return [[VID] * per_frame for _ in range(t)]
    if kind == "video" and model_type == "ernie4_5_vl_moe":
        t //= TMERGE
    if layout == "indexed_images":
        return [[VSTART] + [IMG] * per_frame + [VEND]]  # HunYuan-VL: the run includes its markers
    return [[IMG if kind == "image" else VID] * (t * per_frame)]


def _build(model_type: str, rows: list[list[tuple]], pad: str | None = None) -> dict[str, Any]:
    """Hugging Face inputs and posenc inputs of ``rows`` (segments per batch row), padded to one
    length on the ``pad`` side."""
    omni = MROPE_POSITION_MODEL_TYPES[model_type].startswith("audio_")
    ids_rows, type_rows = [], []
    images, videos, seconds, audio_lens = [], [], [], []
    for segments in rows:
        ids: list[int] = []
        types: list[int] = []

        def text(n: int, ids: list[int] = ids, types: list[int] = types) -> None:
            ids.extend(100 + (len(ids) + i) % 50 for i in range(n))
            types.extend([0] * n)

        for seg in segments:
            kind = seg[0]
            if kind == "text":
                text(seg[1])
            elif kind in ("image", "video") and not omni:
                (images if kind == "image" else videos).append(seg[1])
                if kind == "video":
                    seconds.append(seg[2])
                for i, run in enumerate(_vision_tokens(model_type, kind, seg[1])):
                    if i:
                        text(3)  # a timestamp between frames
                    ids.extend(run)
                    types.extend([1 if kind == "image" else 2] * len(run))  # markers too
            elif kind in ("image", "video"):
                grid = seg[1]
                (images if kind == "image" else videos).append(grid)
                if kind == "video":
                    seconds.append(seg[2])
                n = grid[0] * (grid[1] // M) * (grid[2] // M)
                tok = IMG if kind == "image" else VID
                ids += [VSTART, *[tok] * n, VEND]
                types += [0, *[TYPES[kind]] * n, 0]
            elif kind == "audio":
                audio_lens.append(seg[1])
                ids += [ASTART, *[AUD] * seg[1], AEND]
                types += [0, *[3] * seg[1], 0]
            elif kind == "video_audio":  # a video with its audio
                grid, sec, a = seg[1], seg[2], seg[3]
                videos.append(grid)
                seconds.append(sec)
                audio_lens.append(a)
                order = _audio_video_order(model_type, grid, sec, a, len(types) + 2)
                ids += [VSTART, ASTART, *[VID if o == 2 else AUD for o in order], AEND, VEND]
                types += [0, 0, *order, 0, 0]
        ids_rows.append(ids)
        type_rows.append(types)
    s = max(len(r) for r in ids_rows)
    input_ids = torch.zeros(len(rows), s, dtype=torch.long)
    token_types = torch.zeros(len(rows), s, dtype=torch.long)
    mask = torch.zeros(len(rows), s, dtype=torch.long)
    for i, (ids, types) in enumerate(zip(ids_rows, type_rows, strict=True)):
        sl = slice(s - len(ids), s) if pad == "left" else slice(0, len(ids))
        input_ids[i, sl], token_types[i, sl], mask[i, sl] = (
            torch.tensor(ids),
            torch.tensor(types),
            1,
        )
    return {
        "input_ids": input_ids, "token_types": token_types,
        "mask": mask if pad else None, "images": torch.tensor(images) if images else None,
        "videos": torch.tensor(videos) if videos else None,
        "seconds": torch.tensor(seconds) if seconds else None, "audio": audio_lens,
    }  # fmt: skip


TYPES = {"image": 1, "video": 2, "audio": 3}


def _audio_video_order(model_type: str, grid: tuple, sec: float, a: int, start: int) -> list[int]:
    """The order of a video's and its audio's tokens, restated: Qwen2.5-Omni puts the tokens of
    each ``seconds_per_chunk`` chunk together, video first; Qwen3-Omni merges by float32 position
    (``start`` + time; only text before it in these cases), video first on ties."""
    t, per = grid[0], (grid[1] // M) * (grid[2] // M)
    frames = torch.arange(t) * torch.tensor(sec) * PPS  # float32, as the models compute it
    # Qwen2.5-Omni floors; Qwen3-Omni keeps the fraction, compared as float32 sums
    frames = frames.long() if model_type == "qwen2_5_omni" else frames + start
    v_time = [v for v in frames.tolist() for _ in range(per)]
    a_time = list(range(a)) if model_type == "qwen2_5_omni" else [start + x for x in range(a)]
    if model_type == "qwen2_5_omni":
        c = PPS * CHUNK
        last = max(v_time[-1], a_time[-1]) // c
        order = []
        for k in range(last + 1):
            order += [2] * sum(k * c <= v < (k + 1) * c for v in v_time)
            order += [3] * sum(k * c <= v < (k + 1) * c for v in a_time)
        return order
    merged = sorted([(v, 0) for v in v_time] + [(x, 1) for x in a_time])
    return [2 if which == 0 else 3 for _, which in merged]


def _raw_audio_length(model_type: str, tokens: int) -> int:
    """A feature length whose audio encoder output is ``tokens`` long (the model's formula)."""
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    for raw in range(1, 20000):
        if model_type == "qwen2_5_omni":
            out = ((raw - 1) // 2 + 1 - 2) // 2 + 1
        else:
            out = int(module._get_feat_extract_output_lengths(torch.tensor(raw), 50))
        if out == tokens:
            return raw
    raise AssertionError(tokens)


def _theirs(model_type: str, inp: dict[str, Any], audio_in_video: bool = False) -> tuple:
    fn, _ = _hf_self(model_type)
    layout = MROPE_POSITION_MODEL_TYPES[model_type]
    if layout.startswith("audio_"):
        mask = inp["mask"] if inp["mask"] is not None else torch.ones_like(inp["input_ids"])
        lens = torch.tensor([_raw_audio_length(model_type, a) for a in inp["audio"]] or [0])
        return fn(
            inp["input_ids"], inp["images"], inp["videos"], mask, audio_in_video, lens,
            inp["seconds"],
        )  # fmt: skip
    kw: dict[str, Any] = {"attention_mask": inp["mask"]}
    if layout != "indexed_images":
        kw["video_grid_thw"] = inp["videos"]
    if model_type == "qwen2_5_vl":
        kw["second_per_grid_ts"] = inp["seconds"]
    return fn(inp["input_ids"], inp["token_types"], image_grid_thw=inp["images"], **kw)


def _ours(model_type: str, inp: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    layout = MROPE_POSITION_MODEL_TYPES[model_type]
    opts = MROPE_POSITION_LAYOUTS[layout].options
    kw: dict[str, Any] = {}
    if "positions_per_second" in opts and (
        layout.startswith("audio_") or model_type == "qwen2_5_vl"
    ):
        kw["positions_per_second"] = PPS if layout.startswith("audio_") else TPS
    whole_videos = ("qwen2_vl", "paddleocr_vl", "ernie4_5_vl_moe")  # no seconds read
    if "seconds_per_grid" in opts and inp["seconds"] is not None and model_type not in whole_videos:
        kw["seconds_per_grid"] = inp["seconds"]
    if layout == "audio_chunked":
        kw["seconds_per_chunk"] = CHUNK
    if model_type == "ernie4_5_vl_moe":
        kw["temporal_merge_size"] = TMERGE
    if layout == "indexed_images":
        kw["num_axes"] = N_AXES
    return mrope_position_ids(
        model_type, inp["token_types"], image_grid_thw=inp["images"],
        video_grid_thw=inp["videos"], spatial_merge_size=M, attention_mask=inp["mask"], **kw,
    )  # fmt: skip


def _same(model_type: str, inp: dict[str, Any], audio_in_video: bool = False) -> None:
    pos, delta = _ours(model_type, inp)
    ref_pos, ref_delta = _theirs(model_type, inp, audio_in_video)
    assert pos.dtype == ref_pos.dtype, (pos.dtype, ref_pos.dtype)
    assert torch.equal(pos, ref_pos), (model_type, pos, ref_pos)
    assert torch.equal(delta.to(ref_delta.dtype), ref_delta.view(delta.shape)), (delta, ref_delta)


VL_CASES = {
    "text only": [[("text", 7)]],
    "one image": [[("text", 3), ("image", (1, 4, 6)), ("text", 4)]],
    "two images": [[("text", 2), ("image", (1, 6, 4)), ("text", 3), ("image", (1, 2, 8)),
                    ("text", 2)]],
    "video with timestamps": [[("text", 2), ("video", (4, 4, 4), 0.5), ("text", 3)]],
    "mixed": [[("text", 1), ("image", (1, 4, 4)), ("text", 2), ("video", (2, 2, 6), 1.5),
               ("text", 2), ("image", (1, 8, 2)), ("text", 1)]],
    "batch": [[("text", 2), ("image", (1, 4, 4)), ("text", 2)],
              [("text", 5), ("video", (2, 4, 2), 2.0), ("text", 1), ("image", (1, 2, 2))]],
}  # fmt: skip


@pytest.mark.parametrize("model_type", sorted(VL_TYPES))
def test_vision_language_layouts_equal_get_rope_index(model_type: str) -> None:
    cases = VL_CASES if model_type != "hunyuan_vl" else {
        k: [[s for s in row if s[0] != "video"] for row in v] for k, v in VL_CASES.items()
    }  # fmt: skip
    for name, rows in cases.items():
        for pad in (None, "left", "right") if len(rows) > 1 else (None,):
            _same(model_type, _build(model_type, rows, pad))
        assert name


OMNI_CASES = {
    "text only": [[("text", 6)], [("text", 3)]],
    "one image": [[("text", 3), ("image", (1, 4, 6)), ("text", 2)]],
    "two images": [[("image", (1, 4, 4)), ("text", 2), ("image", (1, 2, 6))]],
    "video": [[("text", 2), ("video", (3, 4, 4), 0.5), ("text", 2)]],
    "audio": [[("text", 2), ("audio", 9), ("text", 1)]],
    "mixed": [[("text", 1), ("image", (1, 4, 4)), ("audio", 5), ("text", 2),
               ("video", (2, 2, 6), 1.2), ("text", 1)]],
    "batch": [[("text", 2), ("audio", 4), ("image", (1, 4, 4)), ("text", 2)],
              [("text", 5), ("video", (2, 4, 2), 2.0), ("text", 1)]],
}  # fmt: skip
AUDIO_IN_VIDEO = {
    "video with its audio": [[("text", 2), ("video_audio", (4, 4, 4), 2.0, 230), ("text", 2)]],
    "two chunks each": [[("video_audio", (3, 2, 2), 1.0, 70), ("text", 1),
                         ("image", (1, 2, 2)), ("text", 2)]],
    "batch": [[("text", 1), ("video_audio", (2, 2, 4), 1.5, 40)],
              [("text", 4), ("video_audio", (5, 2, 2), 0.8, 95), ("text", 3)]],
}  # fmt: skip


@pytest.mark.parametrize("model_type", ["qwen2_5_omni", "qwen3_omni_moe"])
def test_omni_layouts_equal_get_rope_index(model_type: str) -> None:
    for rows in OMNI_CASES.values():
        if not any(s[0] in ("image", "video") for row in rows for s in row):
            pad_modes: tuple = ("right",)  # transformers' text-only path needs a mask
        else:
            pad_modes = (None, "left") if len(rows) > 1 else (None,)
        for pad in pad_modes:
            _same(model_type, _build(model_type, rows, pad))
    for rows in AUDIO_IN_VIDEO.values():
        for pad in (None, "left") if len(rows) > 1 else (None,):
            _same(model_type, _build(model_type, rows, pad), audio_in_video=True)


def test_omni_float_positions_are_fractional() -> None:
    """Qwen3-Omni keeps a video's fractional temporal positions (0.04 s per grid * 25 = 1.0 ...,
    0.5 s * 25 = 12.5); Qwen2.5-Omni floors them."""
    rows = [[("text", 1), ("video", (3, 2, 2), 0.5), ("text", 1)]]
    q3 = _ours("qwen3_omni_moe", _build("qwen3_omni_moe", rows))[0]
    q25 = _ours("qwen2_5_omni", _build("qwen2_5_omni", rows))[0]
    assert q3.dtype == torch.float32 and (q3 % 1 != 0).any()
    assert q25.dtype == torch.long
    _same("qwen3_omni_moe", _build("qwen3_omni_moe", rows))


def test_layout_table_is_what_each_model_runs() -> None:
    """Planted fault: each model type read with another layout no longer matches its model."""
    rows = VL_CASES["mixed"]
    swaps = {"qwen2_vl": "interleaved_runs_per_frame", "qwen3_vl": "interleaved_runs",
             "hy_v4_vl": "interleaved_runs"}  # fmt: skip
    for model_type, wrong in swaps.items():
        inp = _build(model_type, rows)
        ref = _theirs(model_type, inp)[0]
        try:
            pos, _ = mrope_position_ids(
                wrong, inp["token_types"], image_grid_thw=inp["images"],
                video_grid_thw=inp["videos"], spatial_merge_size=M,
            )  # fmt: skip
        except ValueError:
            continue  # refused: the token counts do not fit the other layout
        assert not torch.equal(pos, ref), (model_type, wrong)


def test_time_interval_is_applied_to_videos_only() -> None:
    """Qwen2.5-VL scales video frames by tokens_per_second * seconds; without the scale (read as
    Qwen2-VL) the temporal positions differ."""
    inp = _build("qwen2_5_vl", [[("text", 2), ("video", (4, 4, 4), 1.5), ("text", 3)]])
    ref = _theirs("qwen2_5_vl", inp)[0]
    plain = mrope_position_ids("qwen2_vl", inp["token_types"], video_grid_thw=inp["videos"],
                               spatial_merge_size=M)[0]  # fmt: skip
    assert not torch.equal(plain, ref)
    assert torch.equal(plain[1:], ref[1:])  # height and width agree, time does not


def test_docs_table_names_every_layout() -> None:
    """docs/rotary.md's table of layouts lists each entry of the table, and no other."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "rotary.md").read_text(encoding="utf-8")
    section = text[text.index("## Multimodal RoPE") :]
    section = section[: section.index("\n## ")]
    rows = re.findall(r"^\| `(\w+)` \|", section, re.M)
    assert sorted(rows) == sorted(MROPE_POSITION_LAYOUTS), rows


# --- errors -------------------------------------------------------------------------------------


def test_bad_grids_and_inputs_say_what_is_wrong() -> None:
    types = torch.tensor([[0, 1, 1, 1, 1, 0]])
    ok = {"image_grid_thw": [[1, 4, 4]], "spatial_merge_size": 2}
    assert mrope_position_ids("qwen2_vl", types, **ok)[0].shape == (3, 1, 6)
    cases = [
        ({"image_grid_thw": [[1, 0, 4]]}, "image_grid_thw h"),
        ({"image_grid_thw": [[1, -4, 4]]}, "image_grid_thw h"),
        ({"image_grid_thw": [[1, 6, 4]]}, "divisible by spatial_merge_size 4"),
        ({"image_grid_thw": [[1, 4, 8]]}, "does not match its grid"),
        ({"image_grid_thw": [[1, 4, 4], [1, 4, 4]]}, "has 2 grids but token_types has 1"),
        ({"image_grid_thw": None}, "more image runs than image_grid_thw has grids"),
        ({"image_grid_thw": [[1, 4]]}, "must be (t, h, w)"),
    ]
    for override, message in cases:
        kw = {**ok, **override}
        if "divisible" in message:
            kw["spatial_merge_size"] = 4
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            mrope_position_ids("qwen2_vl", types, **kw)
    with pytest.raises(ValueError, match="layout must be one of"):
        mrope_position_ids("qwen9_vl", types, **ok)
    with pytest.raises(ValueError, match="does not read"):
        mrope_position_ids("qwen3_vl", types, seconds_per_chunk=2.0, **ok)
    with pytest.raises(ValueError, match="qwen2_5_vl needs positions_per_second"):
        mrope_position_ids("qwen2_5_vl", types, **ok)
    with pytest.raises(ValueError, match="token types"):
        mrope_position_ids("qwen2_vl", torch.tensor([[0, 3, 3]]))
    with pytest.raises(ValueError, match=r"\[b, s\]"):
        mrope_position_ids("qwen2_vl", torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="seconds_per_grid must be finite"):
        mrope_position_ids("qwen2_5_vl", torch.tensor([[2] * 4]), video_grid_thw=[[1, 4, 4]],
                           spatial_merge_size=2, positions_per_second=2,
                           seconds_per_grid=[float("nan")])  # fmt: skip
    with pytest.raises(ValueError, match="temporal_merge_size"):
        mrope_position_ids("ernie4_5_vl_moe", torch.tensor([[2] * 4]), video_grid_thw=[[3, 4, 4]],
                           spatial_merge_size=2, temporal_merge_size=2)  # fmt: skip
    with pytest.raises(ValueError, match="two start and two end"):
        inp = _build("qwen2_5_omni", AUDIO_IN_VIDEO["video with its audio"])
        t = inp["token_types"].clone()
        t = t[:, 3:]  # one start marker left before the video
        mrope_position_ids("qwen2_5_omni", t, video_grid_thw=inp["videos"], spatial_merge_size=M,
                           positions_per_second=PPS, seconds_per_grid=inp["seconds"],
                           seconds_per_chunk=CHUNK)  # fmt: skip
    with pytest.raises(ValueError, match="framed by its start and end marker tokens"):
        mrope_position_ids("qwen3_omni_moe", torch.tensor([[1, 1, 1, 1, 0]]),
                           image_grid_thw=[[1, 4, 4]], spatial_merge_size=2,
                           positions_per_second=PPS)  # fmt: skip
    with pytest.raises(ValueError, match="not in the order"):
        inp = _build("qwen3_omni_moe", AUDIO_IN_VIDEO["video with its audio"])
        t = inp["token_types"].clone()
        t[0, 4:-4] = t[0, 4:-4].flip(0)
        mrope_position_ids("qwen3_omni_moe", t, video_grid_thw=inp["videos"],
                           spatial_merge_size=M, positions_per_second=PPS,
                           seconds_per_grid=inp["seconds"])  # fmt: skip
