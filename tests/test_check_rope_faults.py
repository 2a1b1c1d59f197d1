"""check_rope's own faults: bad sizes, NaN outputs, the float32 floor, a hanging implementation.

Every implementation here is written out in the test (the rotation formula in float64), none is
posenc's: a planted fault in check_rope cannot hide behind a shared helper.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from posenc.testing import RopeReport, check_rope, rope_probes

PLAIN = {
    "model_type": "llama", "hidden_size": 512, "num_attention_heads": 4,
    "max_position_embeddings": 4096, "rope_theta": 10000.0,
}  # fmt: skip
SMALL = {"batch": 2, "heads": 2, "kv_heads": 1}
F32 = (torch.float32,)


def naive_rope(
    base: float = 10000.0, shift: float = 0.0, gain: float = 1.0, layout: str = "half"
) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """RoPE from the paper's formula in float64: angle ``(p + shift) * base^(-2i/d)``, pairs
    ``(x[i], x[i + d/2])`` (half) or ``(x[2i], x[2i+1])``, outputs times ``gain``."""

    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        y, n = x.double(), x.shape[-1] // 2
        if layout == "half":
            a, b = y[..., :n], y[..., n:]
            out = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
        else:
            a, b = y[..., 0::2], y[..., 1::2]
            out = torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
        return (out * gain).to(x.dtype)

    def impl(q, k, position_ids, layer_type):
        d = q.shape[-1]
        inv_freq = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # [d/2]
        angles = (position_ids.double()[..., None] + shift) * inv_freq  # [b, s, d/2]
        cos, sin = angles.cos()[:, None], angles.sin()[:, None]  # [b, 1, s, d/2]
        return rotate(q, cos, sin), rotate(k, cos, sin)

    return impl


def test_the_naive_rope_passes() -> None:
    report = check_rope(naive_rope(), PLAIN, **SMALL)
    assert report.ok, report


# --- 1. sizes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"batch": 0}, "batch must be a positive integer, got 0"),
        ({"batch": -1}, "batch must be a positive integer, got -1"),
        ({"batch": 2.0}, "batch must be a positive integer, got 2.0"),
        ({"heads": 0}, "heads must be a positive integer, got 0"),
        ({"kv_heads": 0}, "kv_heads must be a positive integer, got 0"),
        ({"batch": 10**9}, r"batch must be <= 1024 \(each probe builds \[b, h, s, d\] inputs\)"),
        ({"dense_limit": 0}, "dense_limit must be a positive integer, got 0"),
        ({"timeout": 0}, r"timeout must be seconds > 0 \(or None: no bound\), got 0"),
        ({"timeout": -1.0}, "timeout must be seconds > 0"),
        ({"timeout": "10"}, "timeout must be seconds > 0"),
    ],
)
def test_bad_sizes_are_one_line_errors(kwargs: dict[str, Any], words: str) -> None:
    calls = []

    def impl(q, k, position_ids, layer_type):
        calls.append(1)
        return q, k

    with pytest.raises(ValueError, match=words) as err:
        check_rope(impl, PLAIN, **kwargs)
    assert "\n" not in str(err.value)
    assert not calls  # refused before any probe ran


# --- 3. NaN is never a zero error ----------------------------------------------------------------


def test_an_all_nan_implementation_fails_every_probe_and_says_nan() -> None:
    def nan(q, k, position_ids, layer_type):
        return torch.full_like(q, math.nan), torch.full_like(k, math.nan)

    report = check_rope(nan, PLAIN, **SMALL)
    assert report.results and not any(r.passed for r in report.results), report
    assert all("NaN in q'" in r.note and "k'" in r.note for r in report.results), report
    assert "NaN" in str(report).splitlines()[0], report


def test_a_partly_nan_implementation_fails_where_the_nan_is() -> None:
    """One NaN in k' wherever the position is 7: exactly the probes holding position 7 fail."""
    good = naive_rope()

    def nan_at_7(q, k, position_ids, layer_type):
        q2, k2 = good(q, k, position_ids, layer_type)
        k2 = k2.clone()
        k2[..., 0][(position_ids == 7)[:, None].expand(k2.shape[:-1])] = math.nan
        return q2, k2

    report = check_rope(nan_at_7, PLAIN, **SMALL)
    with_7 = {p.name for p in rope_probes(4096, batch=2)[0] if bool((p.position_ids == 7).any())}
    assert with_7, "no probe holds position 7"
    assert {r.probe for r in report.failures} == with_7, report
    assert all(r.note.startswith("NaN in k' (") for r in report.failures), report
    assert all(r.first_failing_position == 7 for r in report.failures), report
    assert "NaN in k'" in str(report).splitlines()[0]


def test_nan_cos_sin_tables_fail() -> None:
    def tables(q, k, position_ids, layer_type):
        d = q.shape[-1]
        inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        angles = position_ids.double()[..., None] * inv_freq  # [b, s, d/2]
        cos, sin = angles.cos(), angles.sin()
        cos[..., -1] = math.nan  # the lowest frequency's cos
        return cos.to(q.dtype), sin.to(q.dtype)

    report = check_rope(tables, PLAIN, **SMALL)
    assert report.kind == "cos_sin" and not any(r.passed for r in report.results), report
    assert all(r.note.startswith("NaN in q'") for r in report.results), report


# --- 4. the float32 floor -------------------------------------------------------------------------


def _worst_change(impl: Callable[..., Any], positions: torch.Tensor) -> float:
    """The worst change a fault makes to unit-norm float64 inputs, against the fault-free rope."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 2, positions.shape[-1], 128, generator=gen, dtype=torch.float64)
    x = x / x.norm(dim=-1, keepdim=True)
    got, want = impl(x, x, positions, None)[0], naive_rope()(x, x, positions, None)[0]
    return float((got - want).abs().max())


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param({"shift": 5e-5}, id="positions-off-by-5e-5"),
        pytest.param({"gain": 1 + 2e-5}, id="attention-factor-off-by-2e-5"),
    ],
)
def test_float32_catches_an_error_just_above_the_floor(fault: dict[str, float]) -> None:
    """A fault whose error on unit-norm inputs is 3-50x the float32 floor (1e-6, the documented
    absolute error below a few thousand positions): caught at float32 on the probes near 0, where
    the floor is the threshold; a floor 100x looser (1e-4) would let every probe through."""
    impl = naive_rope(**fault)
    worst = _worst_change(impl, torch.arange(64)[None].expand(2, -1))
    assert 3e-6 < worst < 5e-5, worst  # just above the floor, under half of 100x it
    report = check_rope(impl, PLAIN, dtypes=F32, **SMALL)
    failed = {r.probe for r in report.failures}
    assert {"position_0", "first_64", "left_padded"} <= failed, report
    assert report.failures[0].probe == "position_0", report
    assert check_rope(naive_rope(), PLAIN, dtypes=F32, **SMALL).ok


# --- 2. a hanging implementation ------------------------------------------------------------------


def _sleeps_on(probe_max: int, seconds: float, calls: list[int]) -> Callable[..., Any]:
    """The naive rope, sleeping ``seconds`` on a call whose largest position is ``probe_max``."""
    good = naive_rope()

    def impl(q, k, position_ids, layer_type):
        calls.append(int(position_ids.max()))
        if int(position_ids.max()) == probe_max:
            time.sleep(seconds)
        return good(q, k, position_ids, layer_type)

    return impl


def _hung(report: RopeReport, where: str, timeout: float) -> None:
    assert not report.ok
    first = report.failures[0]
    assert first.where == where, report
    assert f"did not return within timeout={timeout:g} s" in first.note, report
    assert where in str(report).splitlines()[0], report
    assert report.skipped[-1] == f"every probe after {where}: the implementation hung there"


def test_a_sleeping_implementation_is_stopped_and_the_probe_named() -> None:
    calls: list[int] = []
    start = time.monotonic()
    report = check_rope(_sleeps_on(63, 30.0, calls), PLAIN, timeout=0.5, **SMALL)
    assert time.monotonic() - start < 10
    _hung(report, "[float32] first_64", 0.5)
    assert [r.probe for r in report.results] == ["position_0", "first_64"]
    assert report.results[0].passed
    assert calls == [0, 63]  # nothing called after the hang


def test_a_pure_python_loop_is_interrupted() -> None:
    def spins(q, k, position_ids, layer_type):
        while True:
            pass

    start = time.monotonic()
    report = check_rope(spins, PLAIN, timeout=0.3, **SMALL)
    assert time.monotonic() - start < 10
    _hung(report, "[float32] position_0", 0.3)


def test_a_broad_except_in_the_implementation_cannot_swallow_the_timeout() -> None:
    def retries(q, k, position_ids, layer_type):
        while True:
            try:
                time.sleep(5)
            except Exception:
                continue

    report = check_rope(retries, PLAIN, timeout=0.3, **SMALL)
    _hung(report, "[float32] position_0", 0.3)


def test_an_outer_alarm_is_restored() -> None:
    """A SIGALRM handler and timer already set (pytest-timeout's) survive the check."""
    if not hasattr(signal, "setitimer"):
        pytest.skip("no setitimer on this platform")
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)
        assert check_rope(naive_rope(), PLAIN, probes=["first_64"], timeout=5, **SMALL).ok
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 20 < left <= 30
        assert signal.getsignal(signal.SIGALRM) is not previous  # ours is back, not the default
        assert not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _in_a_thread(fn: Callable[[], RopeReport]) -> RopeReport:
    box: list[RopeReport] = []
    runner = threading.Thread(target=lambda: box.append(fn()))
    runner.start()
    runner.join(20)
    assert box, "check_rope did not return in its thread"
    return box[0]


def _workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "check_rope-impl"]


def test_off_the_main_thread_a_python_loop_is_stopped() -> None:
    """No signals there: the call runs in a worker thread; on timeout an exception is posted to
    it, which ends a pure-Python loop."""

    def spins(q, k, position_ids, layer_type):
        while True:
            pass

    report = _in_a_thread(lambda: check_rope(spins, PLAIN, timeout=0.3, **SMALL))
    _hung(report, "[float32] position_0", 0.3)
    deadline = time.monotonic() + 5
    while _workers() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _workers()


def test_off_the_main_thread_a_sleep_is_left_to_finish() -> None:
    """A worker blocked in C (a sleep) cannot be stopped: the check goes on at once, the worker
    ends when the sleep returns (the documented limit)."""
    calls: list[int] = []
    impl = _sleeps_on(0, 1.5, calls)
    start = time.monotonic()
    report = _in_a_thread(lambda: check_rope(impl, PLAIN, timeout=0.2, **SMALL))
    assert time.monotonic() - start < 1.4
    _hung(report, "[float32] position_0", 0.2)
    assert _workers()  # still sleeping
    deadline = time.monotonic() + 10
    while _workers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _workers() and calls == [0]


def test_no_timeout_means_no_bound() -> None:
    calls: list[int] = []
    report = check_rope(_sleeps_on(0, 0.3, calls), PLAIN, timeout=None, dtypes=F32, **SMALL)
    assert report.ok, report
    assert calls[0] == 0 and len(calls) == len(report.results)
