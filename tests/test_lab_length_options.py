"""The lab's label options for any encoding: training-time length methods (``positions=``,
Ruoss et al. 2023 and PoSE) and Llama-4's NoPE layers and query temperature (``nope_every=``,
``temperature=``): parsing, validation, the sampler train_model receives, identities (plain
labels pinned to their hashes from before the options existed), ``--encodings length`` and a
tiny grid end to end."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
from transformers import Llama4TextConfig

from _hf_corpus_paths import config_path
from posenc import registry
from posenc.functional.length import pose_positions, randomized_positions
from posenc.lab.cells import presets as P
from posenc.lab.grid.experiment import RunOptions, resolve_encodings, run_grid
from posenc.lab.training.data import load_data, step_generator
from posenc.lab.training.train import train_model
from posenc.model import TemperedAttention, TransformerLM
from posenc.rotary.temperature import QueryTemperature

SMALL = P.preset("cpu-small")  # L = 64, eval to 8L = 512, 2 layers


# --- parsing -----------------------------------------------------------------------------------


def test_lab_options_are_split_off_the_encoding_options() -> None:
    label = "rope:base=500:positions=pose:pose_chunks=3:nope_every=2:temperature=llama4"
    m = P.model_config(SMALL, label, 256)
    assert m.encoding == "rope" and m.encoding_kwargs == {"base": 500}
    assert m.nope_every == 2
    assert m.temperature == QueryTemperature("llama4_temperature", 0.1, 64, layers=(1,))
    opts = P.lab_options(SMALL, label)
    assert opts.positions == P.PositionSampling("pose", 256, 3)
    assert opts.row() == {
        "positions": "pose",
        "positions_len": 256,
        "pose_chunks": 3,
        "nope_every": 2,
        "temperature": "llama4",
    }
    assert P.lab_options(SMALL, "rope").row() == {} and P.position_sampler(SMALL, "rope") is None
    TransformerLM(m)  # builds


def test_no_registered_encoding_has_an_option_named_like_a_lab_option() -> None:
    """Lab options are split off before registry.build: one of the same name would be shadowed."""
    for name in registry.names():
        assert not set(registry.options(name)) & set(P.LAB_OPTIONS), name


@pytest.mark.parametrize(
    ("label", "method", "length", "chunks"),
    [
        ("rope:positions=randomized", "randomized", 512, None),  # the longest eval length, 8L
        ("rope:positions=pose", "pose", 256, 2),  # PoSE: 4L, two chunks
        ("alibi:positions=pose:positions_len=2x", "pose", 128, 2),
        ("rope:positions=randomized:positions_len=300", "randomized", 300, None),
        ("rope:positions=pose:positions_len=64:pose_chunks=5", "pose", 64, 5),
        ("learned:max_positions=512:positions=randomized", "randomized", 512, None),  # covered
    ],
)
def test_position_ranges(label: str, method: str, length: int, chunks: int | None) -> None:
    sampling = P.position_sampler(SMALL, label)
    assert sampling is not None and sampling.method == method and sampling.length == length
    want = {"method": method, "length": length}
    if chunks is not None:
        want["chunks"] = chunks
    assert sampling.identity() == want


def test_randomized_range_follows_the_grid_eval_lengths() -> None:
    cfg = replace(SMALL, eval=replace(SMALL.eval, lengths=("1x", "2x", "16x")))
    assert P.position_sampler(cfg, "rope:positions=randomized").length == 1024
    assert P.position_sampler(cfg, "rope:positions=pose").length == 256  # 4L whatever the eval


def test_temperatures_use_the_published_scales_at_the_train_length() -> None:
    """Llama-4: transformers' Llama4TextConfig defaults (the published Maverick config leaves
    attn_scale and floor_scale unset) on the NoPE layers, floor_scale -> L. Ministral-3: its
    published llama_4_scaling_beta on every layer, original_max_position_embeddings -> L."""
    ref = Llama4TextConfig()
    maverick = json.loads(config_path("llama-4-maverick-17b-128e").read_text())
    assert "attn_scale" not in maverick["text_config"]  # so the default is Llama-4's
    llama4 = P.model_config(SMALL, "rope:nope_every=2:temperature=llama4", 256).temperature
    assert llama4 == QueryTemperature("llama4_temperature", ref.attn_scale, 64, layers=(1,))
    ministral = json.loads(config_path("ministral-3-3b-reasoning-2512").read_text())
    beta = ministral["text_config"]["rope_parameters"]["llama_4_scaling_beta"]
    got = P.model_config(SMALL, "alibi:temperature=ministral", 256).temperature
    assert got == QueryTemperature("llama4_scaling", beta, 64, layers=None)
    # The Llama-4 scale at L steps past 1 at position L - 1 (formula in float64 by hand).
    scale = llama4.scale(torch.tensor([0, 62, 63, 511]))
    want = [math.log1p(math.floor((p + 1) / 64)) * 0.1 + 1 for p in (0, 62, 63, 511)]
    torch.testing.assert_close(scale.double(), torch.tensor(want, dtype=torch.float64))
    model = TransformerLM(P.model_config(SMALL, "rope:nope_every=2:temperature=llama4", 256))
    assert [b.attn.encoding is None for b in model.blocks] == [False, True]
    assert [isinstance(b.attn, TemperedAttention) for b in model.blocks] == [False, True]


# --- validation --------------------------------------------------------------------------------


def test_unknown_options_name_the_encodings_and_the_labs() -> None:
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['colour'\] for encoding 'rope'.*"
                       r"and the lab's \['positions', 'positions_len', 'pose_chunks', 'nope_every', "
                       r"'temperature'\]"):  # fmt: skip
        resolve_encodings(["rope:colour=red:positions=pose"])
    # Lab options are accepted for any encoding, beside its own.
    for name in registry.names():
        family = registry.entry(name).family
        label = f"{name}:temperature=ministral" + ("" if family == "absolute" else ":nope_every=1")
        assert resolve_encodings([label]) == [label]


@pytest.mark.parametrize(
    ("label", "match"),
    [
        ("rope:positions=sorted", r"positions must be one of randomized, pose, got 'sorted'"),
        ("rope:positions=1", r"positions must be one of randomized, pose, got 1"),
        ("rope:positions_len=4x", r"positions_len .* add positions=randomized or positions=pose"),
        ("rope:positions=randomized:pose_chunks=3", r"pose_chunks .* needs positions=pose"),
        ("rope:positions=pose:pose_chunks=1", r"pose_chunks must be an integer >= 2"),
        ("rope:nope_every=0", r"nope_every must be a positive integer, got 0"),
        ("rope:nope_every=true", r"nope_every must be a positive integer, got True"),
        ("sinusoidal:nope_every=2", r"nope_every .* 'sinusoidal' is absolute"),
        ("rope:temperature=llama3", r"temperature must be one of llama4, ministral, got 'llama3'"),
        ("rope:temperature=llama4", r"temperature=llama4 .* add nope_every=N"),
        ("none:positions=randomized", r"'none' reads no position ids"),
        ("cope:positions=pose", r"'cope' reads no position ids"),
    ],
)
def test_bad_labels_fail_before_anything_trains(label: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        resolve_encodings([label])
    with pytest.raises(ValueError, match=match):
        resolve_encodings(["rope", "length", label])
    with pytest.raises(ValueError, match=match):
        P.model_config(SMALL, label, 256)


@pytest.mark.parametrize(
    ("label", "match"),
    [
        ("learned:positions=randomized", r"past its learned table of 64 .* max_positions=512"),
        ("learned:max_positions=200:positions=pose", r"learned table of 200 .* max_positions=256"),
        ("rope:positions=pose:positions_len=32", r"positions_len \(32\) must be >= the train"),
        ("rope:positions=pose:positions_len=1.3x", r"positions_len must be a positive integer"),
        ("rope:positions=randomized:positions_len=2000000", r"<= 1048576"),
        ("rope:positions=pose:pose_chunks=65", r"pose_chunks must be <= the train length \(64\)"),
        ("rope:nope_every=3", r"nope_every=3 leaves no NoPE layer in a 2-layer model"),
    ],
)
def test_bad_options_for_this_grid(label: str, match: str, tmp_path) -> None:
    resolve_encodings([label])  # fine without a grid
    with pytest.raises(ValueError, match=match):
        P.model_config(SMALL, label, 256)
    with pytest.raises(ValueError, match=match):  # and the grid refuses it before any cell
        run_grid(replace(SMALL, encodings=(label,)), RunOptions(out=tmp_path, quiet=True))
    assert not (tmp_path / "results.jsonl").exists()


# --- the sampler -------------------------------------------------------------------------------


@pytest.mark.parametrize("label", ["rope:positions=randomized", "rope:positions=pose"])
def test_sampler_is_a_pure_function_of_seed_and_step(label: str) -> None:
    sampler = P.position_sampler(SMALL, label)
    a = sampler(7, 16, 64, 0)
    assert a.shape == (16, 64) and a.dtype == torch.int64
    assert int(a.min()) >= 0 and int(a.max()) < sampler.length
    assert bool((a.diff(dim=-1) > 0).all())
    assert int(a.max()) >= 64  # a longer context than arange (16 rows)
    torch.testing.assert_close(sampler(7, 16, 64, 0), a)  # resume-safe
    assert not torch.equal(sampler(8, 16, 64, 0), a)  # another step
    assert not torch.equal(sampler(7, 16, 64, 1), a)  # another seed
    # From its own stream: the token batch of the same (seed, step) draws from salt 0.
    g = step_generator(0, 7, P.POSITIONS_SALT)
    if sampler.method == "randomized":
        want = randomized_positions(16, 64, 512, generator=g)
    else:
        want = pose_positions(16, 64, 256, 2, generator=g)
        assert bool((a[:, 0] == 0).all())  # PoSE's first chunk starts at 0
    torch.testing.assert_close(a, want)


def test_train_model_receives_the_sampled_positions(monkeypatch, tmp_path) -> None:
    """A tiny train_model run: each step's forward gets the sampler's positions of that step,
    and training on them gives other losses than arange."""
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))
    cfg = replace(
        SMALL,
        train_len=16,
        model=P.ModelShape(dim=16, num_layers=2, num_heads=2),
        train=P.TrainConfig(steps=3, batch_size=4, warmup_steps=1),
        eval=replace(SMALL.eval, lengths=("1x", "4x")),
    )
    data = load_data(P.DataConfig(source="task", task="copy"))
    label = "rope:positions=randomized"
    sampler = P.position_sampler(cfg, label)
    seen: list[torch.Tensor | None] = []
    forward = TransformerLM.forward

    def recording(self, tokens, positions=None, *args, **kwargs):
        seen.append(None if positions is None else positions.clone())
        return forward(self, tokens, positions, *args, **kwargs)

    monkeypatch.setattr(TransformerLM, "forward", recording)
    kw = {"data": data, "seed": 0, "identity": {}, "ckpt_dir": None}
    mcfg = P.model_config(cfg, label, data.vocab_size)
    moved = train_model(mcfg, cfg.train, positions=sampler, **kw).stats["loss_curve_bits"]
    assert len(seen) == 3
    for step, pos in enumerate(seen):
        torch.testing.assert_close(pos, sampler(step, 4, 16, 0))
    seen.clear()
    plain = train_model(mcfg, cfg.train, **kw).stats["loss_curve_bits"]
    assert seen == [None, None, None]
    assert moved != plain  # same initial weights and tokens, other positions


# --- identities --------------------------------------------------------------------------------

#: cpu-small, seed 0, vocab 256, data fingerprint "fp": the train identity of a plain rope cell
#: as written before the lab options existed (commit 6b20861), key for key.
PLAIN_ROPE_IDENTITY = {
    "data": {"dataset": None, "fingerprint": "fp", "include_tests": False, "path": None,
             "source": "stdlib", "split_seed": 0, "task": None, "test_frac": 0.05,
             "valid_frac": 0.05},
    "model": {"causal": True, "dim": 128, "dropout": 0.0, "encoding": "rope",
              "encoding_kwargs": {}, "max_len": 64, "mlp_ratio": 4.0, "num_heads": 4,
              "num_kv_heads": None, "num_layers": 2, "vocab_size": 256},
    "schema": 1,
    "seed": 0,
    "train": {"batch_size": 16, "beta1": 0.9, "beta2": 0.95, "grad_clip": 1.0, "lr": 0.003,
              "min_lr_ratio": 0.1, "steps": 500, "warmup_steps": 40, "weight_decay": 0.1},
}  # fmt: skip

#: (preset, label) -> (train hash, cell hash) computed at commit 6b20861, before the options.
PINNED_HASHES = {
    ("cpu-small", "rope"): ("f56d01cdf9b9", "04497c1da9d4"),
    ("cpu-small", "alibi"): ("d423c1fd9253", "68843ec77c90"),
    ("cpu-small", "learned"): ("1187692b7a87", "b168b88ad0cb"),
    ("cpu-small", "sinusoidal"): ("6d3fa7fd88b9", "710a234899f0"),
    ("cpu-small", "none"): ("0eb4ae6f1b4c", "36c29fca3f1f"),
    ("cpu-small", "rope:base=500"): ("367d12811adc", "095e8c59f7d2"),
    ("cpu-small", "cope"): ("3fe32b986e9d", "d474e1990396"),
    ("gpu-small", "rope"): ("90da3001d65b", "09e7e1c0b3d2"),
    ("gpu-small", "t5"): ("834f50577bf7", "36c0eb4cf472"),
}


def test_plain_labels_keep_their_identities() -> None:
    """Identity versions 2 and 3 add the encoding's code (posenc.lab.cells.identity.code_identity,
    with posenc's own source hash since version 3) and nothing else: without it, a plain
    label's identity and hashes are version 1's."""
    from posenc.lab.cells.identity import code_identity

    got = json.loads(json.dumps(P.train_identity(SMALL, "rope", 0, 256, "fp")))
    assert got.pop("code") == code_identity("rope")
    assert got == PLAIN_ROPE_IDENTITY
    for (preset, label), want in PINNED_HASHES.items():
        cfg = P.preset(preset)
        train = P.train_identity(cfg, label, 0, 256, "fp")
        train = {k: v for k, v in train.items() if k != "code"}  # version 1's part
        cell = P.cell_identity(train, P.eval_identity(cfg))
        assert (P.stable_hash(train), P.stable_hash(cell)) == want, (preset, label)


def test_options_enter_the_identity_only_when_set() -> None:
    def ident(label: str) -> dict:
        return json.loads(json.dumps(P.train_identity(SMALL, label, 0, 256, "fp")))

    plain = ident("rope")
    pose = ident("rope:positions=pose")
    assert pose.pop("positions") == {"method": "pose", "length": 256, "chunks": 2}
    assert pose == plain  # the encoding's options and the model are rope's
    assert ident("rope:positions=pose:pose_chunks=3")["positions"]["chunks"] == 3
    assert ident("rope:positions=randomized")["positions"] == {
        "method": "randomized",
        "length": 512,
    }
    nope = ident("rope:nope_every=2:temperature=llama4")
    assert "positions" not in nope
    assert nope["model"].pop("nope_every") == 2
    assert nope["model"].pop("temperature") == {
        "kind": "llama4_temperature", "beta": 0.1, "length": 64, "layers": [1]
    }  # fmt: skip
    assert nope == plain
    hashes = {P.stable_hash(ident(label)) for label in P.LENGTH_ENCODINGS}
    assert len(hashes) == len(P.LENGTH_ENCODINGS)  # every cell of the set trains something else


# --- --encodings length ------------------------------------------------------------------------


def test_length_set_expands_and_the_default_grid_is_unchanged() -> None:
    assert resolve_encodings(["length"]) == list(P.LENGTH_ENCODINGS)
    assert resolve_encodings(["rope", "length", "none"]) == [*P.LENGTH_ENCODINGS, "none"]
    assert set(P.LENGTH_ENCODINGS) >= {
        "rope", "rope:positions=randomized", "rope:positions=pose", "alibi",
        "alibi:positions=randomized", "alibi:positions=pose", "cope", "rope:nope_every=2",
        "rope:nope_every=2:temperature=llama4",
    }  # fmt: skip
    assert P.DEFAULT_ENCODINGS == (
        "none", "sinusoidal", "learned", "rope", "xpos", "alibi", "t5", "kerple", "fire",
        "sandwich", "shaw", "transformer-xl", "deberta",
    )  # fmt: skip
    assert SMALL.encodings == P.DEFAULT_ENCODINGS
    for label in P.LENGTH_ENCODINGS:  # every cell builds on cpu-small
        TransformerLM(P.model_config(SMALL, label, 256))


# --- a tiny grid -------------------------------------------------------------------------------


def test_tiny_grid_with_pose_and_llama4_temperature(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    labels = ("rope", "rope:positions=pose", "rope:nope_every=2:temperature=llama4")
    cfg = replace(
        P.LabConfig(),
        preset="test",
        encodings=labels,
        train_len=16,
        model=P.ModelShape(dim=32, num_layers=2, num_heads=2),
        train=P.TrainConfig(steps=6, batch_size=4, warmup_steps=2),
        data=P.DataConfig(source="task", task="copy"),
        eval=P.EvalConfig(
            lengths=("1x", "2x"),
            tokens=256,
            batch_tokens=128,
            curve_points=8,
            rope_scalings=("ntk",),
        ),
        ckpt_every=3,
    )
    summary = run_grid(cfg, RunOptions(out=tmp_path / "o", quiet=True))
    assert not summary.failed and [r["encoding"] for r in summary.rows] == list(labels)
    plain, pose, llama4 = summary.rows
    assert plain["length_method"] == "arange" and plain["lab_options"] == {}
    assert "positions" not in plain["identity"]["train"]
    assert pose["length_method"] == "pose" and pose["encoding_kwargs"] == {}
    assert pose["lab_options"] == {"positions": "pose", "positions_len": 64, "pose_chunks": 2}
    assert pose["identity"]["train"]["positions"] == {"method": "pose", "length": 64, "chunks": 2}
    assert llama4["length_method"] == "arange"
    assert llama4["lab_options"] == {"nope_every": 2, "temperature": "llama4"}
    assert llama4["identity"]["train"]["model"]["temperature"]["layers"] == [1]
    # The same tokens and initial weights: PoSE's positions changed what was learned.
    assert pose["train"]["loss_curve_bits"] != plain["train"]["loss_curve_bits"]
    for row in summary.rows:  # evaluated at both lengths (with arange positions)
        assert set(row["eval"]["variants"]["base"]["results"]) >= {"16", "32"}
    assert run_grid(cfg, RunOptions(out=tmp_path / "o", quiet=True)).trained == []  # all found


def test_rope_rescalings_evaluate_a_model_with_nope_layers(monkeypatch, tmp_path) -> None:
    from posenc.lab.evaluation.evaluate import evaluate_model
    from posenc.lab.training.train import Dist

    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))
    cfg = replace(SMALL, train_len=16, model=P.ModelShape(dim=32, num_layers=2, num_heads=2))
    data = load_data(P.DataConfig(source="task", task="copy"))
    model = TransformerLM(P.model_config(cfg, "rope:nope_every=2", data.vocab_size)).eval()
    ev = P.EvalConfig(lengths=("1x", "2x"), tokens=256, batch_tokens=128, rope_scalings=("ntk",))
    out = evaluate_model(model, data, 16, [16, 32], ev, Dist())
    assert out["variants"]["ntk"]["results"]["32"]["bits"] is not None
    # The NoPE layer stayed without an encoding, the other got the rescaled copy and back.
    assert model.blocks[1].attn.encoding is None and model.blocks[0].attn.encoding is not None
