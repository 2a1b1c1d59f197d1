"""Training-time position samplers: randomized positions (Ruoss et al. 2023) and PoSE (Zhu et al.
2024), against the papers' definitions restated one row and one chunk at a time."""

import itertools
import math

import pytest
import torch

from posenc.functional.length import pose_positions, pose_positions_from, randomized_positions


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- randomized positions ----------------------------------------------------------------------


def test_randomized_positions_are_sorted_distinct_and_in_range() -> None:
    pos = randomized_positions(64, 20, 80, generator=gen())
    assert pos.shape == (64, 20) and pos.dtype == torch.int64
    assert bool((pos.diff(dim=-1) > 0).all()) and int(pos.min()) >= 0 and int(pos.max()) < 80
    torch.testing.assert_close(pos, randomized_positions(64, 20, 80, generator=gen()))
    assert not torch.equal(pos, randomized_positions(64, 20, 80, generator=gen(1)))
    torch.testing.assert_close(randomized_positions(3, 5, 5), torch.arange(5).expand(3, 5))


def restated_randomized(batch: int, length: int, max_len: int, g: torch.Generator) -> torch.Tensor:
    """Section 3 row by row from the documented draws of the same generator: ``max_len`` iid
    float64 uniforms per row; the positions are the indices of the ``length`` largest, ascending
    (a uniformly random ``length``-subset of ``{0, ..., max_len - 1}``, sorted)."""
    keys = torch.rand(batch, max_len, generator=g, dtype=torch.float64)
    rows = []
    for b in range(batch):
        order = sorted(range(max_len), key=lambda j: -float(keys[b, j]))
        rows.append(sorted(order[:length]))
    return torch.tensor(rows)


@pytest.mark.parametrize(("length", "max_len"), [(12, 30), (16, 128), (1, 9), (7, 7)])
def test_randomized_equals_restated_sampler(length: int, max_len: int) -> None:
    got = randomized_positions(16, length, max_len, generator=gen(5))
    torch.testing.assert_close(got, restated_randomized(16, length, max_len, gen(5)))


def test_randomized_positions_are_a_uniform_subset() -> None:
    """Every one of the C(7, 3) = 35 subsets is equally likely (a chi-square bound)."""
    n = 35_000
    rows = randomized_positions(n, 3, 7, generator=gen()).tolist()
    counts = {s: 0 for s in itertools.combinations(range(7), 3)}
    for row in rows:
        counts[tuple(row)] += 1
    expected = n / 35
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 70  # 34 degrees of freedom: P(chi2 > 70) < 1e-3


# --- PoSE --------------------------------------------------------------------------------------


def naive_pose(lengths: list[int], skips: list[int]) -> list[int]:
    """Eq. 3-4: chunk i holds {u_i + st_i, ..., u_i + st_i + l_i - 1}, st_i = l_0 + ... + l_{i-1}."""
    out: list[int] = []
    st = 0
    for li, ui in zip(lengths, skips, strict=True):
        out += [ui + st + m for m in range(li)]
        st += li
    return out


def restated_pose(batch, length, target_len, num_chunks, g):
    """The sampler of Section 3.2 row by row, from the documented draws of the same generator."""
    keys = torch.rand(batch, length - 1, generator=g, dtype=torch.float64)
    r = torch.rand(batch, num_chunks - 1, generator=g, dtype=torch.float64)
    rows = []
    for b in range(batch):
        order = sorted(range(length - 1), key=lambda j: -float(keys[b, j]))
        cuts = sorted(j + 1 for j in order[: num_chunks - 1])
        bounds = [0, *cuts, length]
        lengths = [bounds[i + 1] - bounds[i] for i in range(num_chunks)]
        skips = [0]  # u_0 = 0
        for i in range(1, num_chunks):
            choices = list(range(skips[-1], target_len - length + 1))  # {u_{i-1}, ..., L_t - L}
            skips.append(choices[math.floor(float(r[b, i - 1]) * len(choices))])
        rows.append(naive_pose(lengths, skips))
    return torch.tensor(rows)


@pytest.mark.parametrize(
    ("length", "target_len", "num_chunks"), [(16, 64, 2), (10, 40, 3), (5, 5, 2)]
)
def test_pose_equals_restated_sampler(length: int, target_len: int, num_chunks: int) -> None:
    got = pose_positions(32, length, target_len, num_chunks, generator=gen(3))
    want = restated_pose(32, length, target_len, num_chunks, gen(3))
    torch.testing.assert_close(got, want)


def test_pose_invariants() -> None:
    pos = pose_positions(500, 12, 48, 3, generator=gen())
    assert pos.shape == (500, 12) and pos.dtype == torch.int64
    assert bool((pos[:, 0] == 0).all())  # u_0 = 0: the first chunk starts at 0
    assert bool((pos.diff(dim=-1) > 0).all()) and int(pos.max()) < 48
    steps = pos.diff(dim=-1)
    # Exactly N - 1 jumps (a zero skip makes a step of 1: at most N - 1 steps above 1),
    # and inside a chunk positions are consecutive.
    assert int((steps > 1).sum(-1).max()) <= 2
    assert int(pos[:, -1].max()) == 47  # the target length is reached (500 draws)


def test_pose_first_skip_is_uniform() -> None:
    """Two chunks: u_1 ~ U({0, ..., L_t - L}), read off as the last position minus L - 1."""
    pos = pose_positions(20_000, 4, 10, 2, generator=gen())
    u1 = (pos[:, -1] - 3).tolist()
    counts = [u1.count(u) for u in range(7)]
    expected = 20_000 / 7
    assert sum((c - expected) ** 2 / expected for c in counts) < 25  # 6 dof: P < 1e-3


def test_pose_positions_from_equals_eq_3_4() -> None:
    lengths = torch.tensor([[3, 2, 4], [1, 1, 7]])
    skips = torch.tensor([[0, 5, 9], [0, 0, 20]])
    want = torch.tensor([naive_pose(lengths[i].tolist(), skips[i].tolist()) for i in range(2)])
    torch.testing.assert_close(pose_positions_from(lengths, skips), want)


def test_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match="max_len must be >= length"):
        randomized_positions(2, 10, 5)
    with pytest.raises(ValueError, match="target_len must be >= length"):
        pose_positions(2, 10, 5)
    with pytest.raises(ValueError, match="num_chunks must be <= length"):
        pose_positions(2, 3, 10, num_chunks=4)
    with pytest.raises(ValueError, match="batch"):
        pose_positions(0, 3, 10)
    with pytest.raises(ValueError, match="chunk_lengths must be positive"):
        pose_positions_from(torch.tensor([[2, 2], [1, 2]]), torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="skips must be an integer"):
        pose_positions_from(torch.tensor([[2, 2]]), torch.zeros(1, 2))
