"""posenc.lab training: schedule, weights-only checkpoints, exact resume, clear errors."""

from __future__ import annotations

import itertools
import math
import random
import re

import numpy as np
import pytest
import torch

from _checkpoint_helpers import flip_tensor_byte
from posenc.lab.cells.presets import DataConfig, TrainConfig
from posenc.lab.training import data as D
from posenc.lab.training import train as T
from posenc.model import ModelConfig

TINY = ModelConfig(vocab_size=256, dim=32, num_layers=1, num_heads=2, max_len=16, encoding="none")
STEPS = TrainConfig(steps=12, batch_size=4, lr=3e-3, warmup_steps=3)


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "text.txt"
    f.write_bytes(b"def f(x):\n    return x + 1\n" * 400)
    return D.load_data(DataConfig(source="text", path=str(f)))


def identity(**extra):
    return {"model": TINY.to_dict(), "seed": 0, **extra}


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    cfg = TrainConfig(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    lrs = [T.lr_at(s, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a <= b for a, b in itertools.pairwise(lrs[:10]))
    assert all(a >= b for a, b in itertools.pairwise(lrs[10:]))
    assert T.lr_at(100, cfg) == pytest.approx(0.1)
    mid = 10 + 45
    assert lrs[mid] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))


def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    T.seed_everything(7)
    state = T.rng_state()
    T.save_checkpoint(tmp_path / "rng.pt", {"identity": {}, "rng": state})
    loaded = torch.load(tmp_path / "rng.pt", weights_only=True)["rng"]
    want = (torch.rand(3), np.random.rand(3), random.random())
    T.set_rng_state(loaded)
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(want[0], got[0]) and np.array_equal(want[1], got[1]) and want[2] == got[2]


def _train(corpus, ckpt_dir, **kw):
    return T.train_model(TINY, STEPS, corpus, seed=0, identity=identity(), ckpt_dir=ckpt_dir, **kw)


def test_interrupted_and_resumed_training_equals_an_uninterrupted_run(corpus, tmp_path):
    ref = _train(corpus, tmp_path / "ref", ckpt_every=5)
    assert not (tmp_path / "ref" / T.LAST).exists() and (tmp_path / "ref" / T.FINAL).exists()

    stop = T.StopFlag()

    def progress(done, bits, tps):
        if done == 7:  # as if SIGTERM arrived during step 7
            stop.signum = 15

    with pytest.raises(T.Interrupted) as info:
        _train(corpus, tmp_path / "run", ckpt_every=5, progress=progress, stop=stop)
    assert info.value.step == 7
    ckpt = torch.load(tmp_path / "run" / T.LAST, weights_only=True)
    assert ckpt["step"] == 7 and ckpt["sampler"]["next_step"] == 7

    with pytest.raises(T.ResumeRequired, match="--resume"):
        _train(corpus, tmp_path / "run", ckpt_every=5)
    torch.manual_seed(123)  # resume must not depend on the process's RNG state
    resumed = _train(corpus, tmp_path / "run", ckpt_every=5, resume=True)
    assert resumed.resumed_from == 7
    for k, v in ref.model.state_dict().items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k
    assert resumed.stats["final_loss_bits"] == ref.stats["final_loss_bits"]
    assert resumed.stats["loss_curve_bits"] == ref.stats["loss_curve_bits"]

    again = _train(corpus, tmp_path / "run")  # final.pt: reused, not retrained
    assert again.reused and again.stats == resumed.stats


def test_sigterm_checkpoints_at_the_next_step_and_stops(corpus, tmp_path):
    import os
    import signal

    stop = T.StopFlag()
    restore = stop.install()
    try:

        def progress(done, bits, tps):
            if done == 4:
                os.kill(os.getpid(), signal.SIGTERM)

        with pytest.raises(T.Interrupted, match="signal 15 at step 4"):
            _train(corpus, tmp_path / "c", progress=progress, stop=stop)
    finally:
        restore()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert torch.load(tmp_path / "c" / T.LAST, weights_only=True)["step"] == 4


def test_restart_discards_an_interrupted_run(corpus, tmp_path):
    stop = T.StopFlag(signum=2)
    with pytest.raises(T.Interrupted):
        _train(corpus, tmp_path / "c", stop=stop)
    result = _train(corpus, tmp_path / "c", restart=True)
    assert result.resumed_from is None and result.stats["steps"] == STEPS.steps


def test_corrupt_checkpoints_fail_clearly(corpus, tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    (d / T.LAST).write_bytes(b"\x00garbage, not a zip")
    with pytest.raises(T.CheckpointError, match="unreadable or corrupt"):
        _train(corpus, d, resume=True)
    # A truncated real checkpoint.
    with pytest.raises(T.Interrupted):
        _train(corpus, tmp_path / "t", stop=T.StopFlag(signum=15))
    blob = (tmp_path / "t" / T.LAST).read_bytes()
    (tmp_path / "t" / T.LAST).write_bytes(blob[: len(blob) // 2])
    with pytest.raises(T.CheckpointError, match="corrupt"):
        _train(corpus, tmp_path / "t", resume=True)
    # A file that would run code when unpickled is refused (weights_only).
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"format": T.CKPT_FORMAT, "evil": Evil()}, d / T.LAST, pickle_module=pickle)
    with pytest.raises(T.CheckpointError, match="unreadable"):
        _train(corpus, d, resume=True)


def test_mismatched_checkpoint_names_the_difference(corpus, tmp_path):
    with pytest.raises(T.Interrupted):
        _train(corpus, tmp_path / "c", stop=T.StopFlag(signum=15))
    other = identity(seed=1)
    with pytest.raises(T.CheckpointError, match=r"another configuration.*seed: 0 -> 1"):
        T.train_model(
            TINY, STEPS, corpus, seed=0, identity=other, ckpt_dir=tmp_path / "c", resume=True
        )
    # Same identity, other shape: the weights do not fit.
    wide = ModelConfig(**{**TINY.to_dict(), "dim": 64})
    with pytest.raises(T.CheckpointError, match="does not fit"):
        T.train_model(
            wide, STEPS, corpus, seed=0, identity=identity(), ckpt_dir=tmp_path / "c", resume=True
        )
    # Not a lab checkpoint at all.
    torch.save({"weights": torch.zeros(2)}, tmp_path / "c" / T.LAST)
    with pytest.raises(T.CheckpointError, match="not a posenc lab checkpoint"):
        _train(corpus, tmp_path / "c", resume=True)


def test_diverging_loss_is_an_error(corpus, tmp_path):
    cfg = TrainConfig(steps=3, batch_size=4, lr=float("inf"), warmup_steps=1)
    with pytest.raises(FloatingPointError, match="loss became"):
        T.train_model(TINY, cfg, corpus, seed=0, identity=identity(), ckpt_dir=tmp_path / "c")


# --- compile and the optimizer's device path --------------------------------------------------


def test_adamw_is_multi_tensor_on_cuda_and_per_parameter_elsewhere():
    from posenc.model import TransformerLM

    model = TransformerLM(TINY)
    assert T.make_optimizer(model, STEPS).defaults["foreach"] is False  # CPU: bit-exact as before
    assert T.make_optimizer(model, STEPS, torch.device("cpu")).defaults["foreach"] is False
    assert T.make_optimizer(model, STEPS, torch.device("cuda")).defaults["foreach"] is True


def test_compile_is_ignored_on_the_cpu(corpus, tmp_path):
    assert not T.compiles(True, torch.device("cpu")) and T.compiles(True, torch.device("cuda"))
    assert not T.compiles(False, torch.device("cuda"))
    eager = _train(corpus, tmp_path / "eager")
    asked = _train(corpus, tmp_path / "asked", compile_model=True)
    assert asked.stats["loss_curve_bits"] == eager.stats["loss_curve_bits"]
    for k, v in eager.model.state_dict().items():
        assert torch.equal(v, asked.model.state_dict()[k]), k


def test_compiled_training_checkpoints_load_into_a_plain_model(corpus, tmp_path, monkeypatch):
    """The CUDA path on the CPU: ``compiles`` forced on, and torch.compile given the eager backend
    (dynamo traces, no code generation), so the test exercises the plumbing in seconds."""
    import functools

    from posenc.model import TransformerLM

    real = torch.compile
    calls = []

    def eager_compile(*args, **kwargs):
        calls.append(args)
        return real(*args, **{**kwargs, "backend": "eager"})

    monkeypatch.setattr(T, "compiles", lambda asked, device: asked)
    monkeypatch.setattr(torch, "compile", eager_compile)
    ref = _train(corpus, tmp_path / "ref")  # compile_model=False: eager
    assert calls == []
    train = functools.partial(_train, corpus, tmp_path / "run", ckpt_every=5, compile_model=True)
    with pytest.raises(T.Interrupted):
        train(stop=T.StopFlag(signum=15))
    assert len(calls) == TINY.num_layers  # each block, in place
    # Checkpoints hold the plain module's keys (no `_orig_mod.`): they load into an eager model.
    plain = TransformerLM(TINY)
    plain.load_state_dict(torch.load(tmp_path / "run" / T.LAST, weights_only=True)["model"])
    resumed = train(resume=True)
    assert len(calls) == 2 * TINY.num_layers
    final = torch.load(tmp_path / "run" / T.FINAL, weights_only=True)["model"]
    assert list(final) == list(plain.state_dict())
    # Same numbers as eager training, and the model handed to evaluation is not compiled.
    got, want = (torch.tensor(r.stats["loss_curve_bits"]) for r in (resumed, ref))
    torch.testing.assert_close(got, want)
    for k, v in ref.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[k], v)
    assert all(getattr(b, "_compiled_call_impl", None) is None for b in resumed.model.blocks)
    n = len(calls)
    resumed.model(torch.zeros(1, 8, dtype=torch.long))
    assert len(calls) == n


# --- checkpoint integrity --------------------------------------------------------------------


def test_a_flipped_byte_inside_a_tensor_is_caught_naming_the_file(corpus, tmp_path):
    with pytest.raises(T.Interrupted):
        _train(corpus, tmp_path / "c", stop=T.StopFlag(signum=15))
    last = tmp_path / "c" / T.LAST
    flip_tensor_byte(last)
    raw = torch.load(last, weights_only=True)  # the container itself still loads
    assert raw["format"] == T.CKPT_FORMAT
    with pytest.raises(
        T.CheckpointError, match=re.escape(str(last)) + ".*do not match the SHA-256 digest"
    ):
        _train(corpus, tmp_path / "c", resume=True)
    # The same for the trained weights a rerun would reuse.
    _train(corpus, tmp_path / "f")
    flip_tensor_byte(tmp_path / "f" / T.FINAL)
    with pytest.raises(T.CheckpointError, match="digest"):
        _train(corpus, tmp_path / "f")


def test_digest_covers_every_value_and_a_checkpoint_without_one_is_refused(tmp_path):
    base = {"identity": {"seed": 0}, "w": torch.arange(4.0), "losses": [1.0, 2.0]}
    d = T.payload_digest(base)
    assert d == T.payload_digest({**base, "w": torch.arange(4.0)})
    for changed in (
        {**base, "w": torch.tensor([0.0, 1.0, 2.0, 3.5])},
        {**base, "w": torch.arange(4.0).double()},  # same values, another dtype
        {**base, "losses": [1.0, 2.0000001]},
        {**base, "identity": {"seed": 1}},
    ):
        assert T.payload_digest(changed) != d
    T.save_checkpoint(tmp_path / "ok.pt", base)
    assert torch.equal(T.read_checkpoint(tmp_path / "ok.pt")["w"], base["w"])
    stripped = torch.load(tmp_path / "ok.pt", weights_only=True)
    del stripped["sha256"]
    torch.save(stripped, tmp_path / "bare.pt")
    with pytest.raises(T.CheckpointError, match=r"bare\.pt is corrupt"):
        T.read_checkpoint(tmp_path / "bare.pt")
