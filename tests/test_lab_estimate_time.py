"""The dry run's wall-time model: cells handed out heaviest first to the first free worker (as
:mod:`posenc.lab.grid.jobs` does), slowed when workers share the CPU, plus the workers' start-up.
Checked against an event simulation written independently (a heap of worker finish times) and
against the bounds any schedule obeys."""

from __future__ import annotations

import heapq
import random

import pytest

from posenc.lab.grid import estimate as E


def simulate(seconds: list[float], workers: int) -> float:
    """An event simulation: each worker's finish time on a heap; the next cell goes to the one
    that frees first (ties: the lower index, as in the order workers start)."""
    heap = [(0.0, i) for i in range(workers)]
    end = 0.0
    for t in seconds:
        free, i = heapq.heappop(heap)
        heapq.heappush(heap, (free + t, i))
        end = max(end, free + t)
    return end


@pytest.mark.parametrize("seed", range(20))
def test_makespan_follows_the_grid_order_on_free_workers(seed: int) -> None:
    rng = random.Random(seed)
    cells = [rng.uniform(1, 100) for _ in range(rng.randint(1, 30))]
    for workers in (1, 2, 3, 8):
        got = E.makespan(cells, workers)
        assert got == pytest.approx(simulate(cells, workers))
        assert got >= max(cells) and got >= sum(cells) / workers - 1e-9
    assert E.makespan(cells, 1) == pytest.approx(sum(cells))


def test_a_long_last_cell_sets_the_end() -> None:
    # The default grid ends with DeBERTa, twice the others: a perfect split would hide it.
    assert E.makespan([40.0] * 12 + [100.0], 2) == pytest.approx(240.0 + 100.0)
    assert sum([40.0] * 12 + [100.0]) / 2 < 340.0


def _estimate(
    jobs: int,
    times: list[float],
    device: str = "cpu",
    weights: list[int] | None = None,
    seeds: int = 1,
) -> E.Estimate:
    weights = weights or [0] * len(times)
    costs = tuple(
        E.LabelCost(f"e{i}", "rotary", 1, 1, 1, 1, 64, train_s=t, eval_s=0.0, weight=(w, 0))
        for i, (t, w) in enumerate(zip(times, weights, strict=True))
    )
    return E.Estimate(costs, seeds=seeds, jobs=jobs, threads=1, device=device, available=None,
                      batch_size=1, train_len=64)  # fmt: skip


@pytest.fixture(autouse=True)
def _system_malloc(monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers leave glibc as it is, so that the estimate slows shared ones by
    PAIR_SLOWDOWN (the one that keeps freed memory is tested apart)."""
    monkeypatch.setenv("POSENC_MALLOC", "system")


def test_workers_that_keep_freed_memory_are_not_slowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(E, "retains", lambda: True)
    assert E.concurrency_slowdown(2, "cpu") == E.RETAINED_PAIR_SLOWDOWN == 1.0
    monkeypatch.setattr(E, "retains", lambda: False)
    assert E.concurrency_slowdown(2, "cpu") == E.PAIR_SLOWDOWN > 1.0
    assert E.concurrency_slowdown(1, "cpu") == E.concurrency_slowdown(2, "cuda") == 1.0


def test_estimate_slows_shared_workers_and_counts_their_start() -> None:
    times = [30.0, 50.0, 40.0, 20.0]
    assert _estimate(1, times).seconds == pytest.approx(sum(times))
    slowed = [t * E.PAIR_SLOWDOWN for t in times]
    assert _estimate(2, times).seconds == pytest.approx(simulate(slowed, 2) + E.WORKER_START_S)
    # on CUDA the workers do not share a CPU's caches: no slowdown, no worker start-up
    assert _estimate(2, times, "cuda").seconds == pytest.approx(simulate(times, 2))


def test_estimate_hands_out_heaviest_first_as_the_run_does() -> None:
    # The heavy label last in the grid: the run starts it first (two seeds: both of its cells),
    # so the estimate simulates that order, not the grid's.
    times, weights = [30.0, 40.0, 20.0, 100.0], [1, 1, 1, 5]
    slowed = [t * E.PAIR_SLOWDOWN for t in [100.0, 100.0, 30.0, 40.0, 20.0, 30.0, 40.0, 20.0]]
    got = _estimate(2, times, weights=weights, seeds=2).seconds
    assert got == pytest.approx(simulate(slowed, 2) + E.WORKER_START_S)
    grid_order = [t * E.PAIR_SLOWDOWN for t in times * 2]
    assert got < simulate(grid_order, 2) + E.WORKER_START_S
    # one worker: the sum, whatever the order
    assert _estimate(1, times, weights=weights, seeds=2).seconds == pytest.approx(2 * sum(times))
