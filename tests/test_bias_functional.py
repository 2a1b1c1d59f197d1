"""The relative-position parity points against transformers and the papers' rules."""

import math

import pytest
import torch
from transformers.models.bloom.modeling_bloom import build_alibi_tensor
from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position
from transformers.models.t5.modeling_t5 import T5Attention

from posenc.functional import (
    alibi_slopes,
    clipped_relative_index,
    deberta_log_bucket,
    kerple_log_bias,
    kerple_power_bias,
    rel_shift,
    relative_position_matrix,
    sandwich_distance_table,
    sincos_2d,
    t5_relative_bucket,
)

REL = torch.arange(-5000, 5001)


def paper_alibi_slopes(n: int) -> list[float]:
    """The ALiBi paper's reference rule (Press et al., fairseq implementation), restated."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + paper_alibi_slopes(2 * closest)[0::2][: n - closest]


def test_alibi_slopes_equal_paper_rule_and_bloom_for_1_to_128_heads() -> None:
    for n in range(1, 129):
        ours = alibi_slopes(n)
        assert ours.shape == (n,) and ours.dtype == torch.float32
        paper = torch.tensor(paper_alibi_slopes(n), dtype=torch.float64)
        torch.testing.assert_close(alibi_slopes(n, torch.float64), paper, rtol=1e-15, atol=0)
        # BLOOM's alibi at key position 1 is the slope (positions are cumsum - 1). BLOOM takes
        # float32 powers (a few ulp off); ours is the float64 value rounded once.
        bloom = build_alibi_tensor(torch.ones(1, 2), n, torch.float32)[:, 0, 1]
        torch.testing.assert_close(ours, bloom, rtol=1e-6, atol=0)
        torch.testing.assert_close(ours, paper.float(), rtol=0, atol=0)


def test_alibi_slopes_known_values() -> None:
    torch.testing.assert_close(alibi_slopes(8), 2.0 ** -torch.arange(1.0, 9.0))
    # 12 heads: the 8 of 8, then the odd ones of 16 (2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5).
    extra = 2.0 ** -torch.tensor([0.5, 1.5, 2.5, 3.5])
    torch.testing.assert_close(alibi_slopes(12)[8:], extra)


@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (64, 256), (10, 40), (4, 3)])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_bucket_equals_transformers(
    num_buckets: int, max_distance: int, bidirectional: bool
) -> None:
    want = T5Attention._relative_position_bucket(REL, bidirectional, num_buckets, max_distance)
    got = t5_relative_bucket(REL, bidirectional, num_buckets, max_distance)
    assert got.dtype == torch.long
    assert torch.equal(got, want)
    assert int(got.min()) >= 0 and int(got.max()) < num_buckets


def test_t5_bucket_any_shape_and_int32() -> None:
    rel = REL[:1000].view(10, 100).int()
    want = T5Attention._relative_position_bucket(rel.long(), True, 32, 128)
    assert torch.equal(t5_relative_bucket(rel), want)


@pytest.mark.parametrize(
    ("bucket_size", "max_position"), [(256, 512), (64, 128), (32, 512), (4, 10)]
)
def test_deberta_log_bucket_equals_transformers(bucket_size: int, max_position: int) -> None:
    want = make_log_bucket_position(REL, bucket_size, max_position)
    got = deberta_log_bucket(REL, bucket_size, max_position)
    assert got.dtype == torch.long
    assert torch.equal(got, want.long())
    # Odd in the relative position, which DeBERTa's p2c term relies on.
    assert torch.equal(deberta_log_bucket(-REL, bucket_size, max_position), -got)


def test_relative_position_matrix_convention_and_shapes() -> None:
    q, k = torch.tensor([2, 3]), torch.tensor([0, 1, 2, 3])
    assert torch.equal(
        relative_position_matrix(q, k), torch.tensor([[-2, -1, 0, 1], [-3, -2, -1, 0]])
    )
    qb = torch.tensor([[2, 3], [5, 9]])
    got = relative_position_matrix(qb, k)
    assert got.shape == (2, 2, 4)
    assert torch.equal(got[1], k[None, :] - qb[1][:, None])
    assert relative_position_matrix(q[None], torch.stack([k, k + 1])).shape == (2, 2, 4)


def test_clipped_relative_index() -> None:
    got = clipped_relative_index(torch.tensor([5]), torch.arange(11), 2)
    assert got.tolist() == [[0, 0, 0, 0, 1, 2, 3, 4, 4, 4, 4]]


def test_sandwich_table_is_the_paper_sum() -> None:
    d_prime, r = 16, 37
    want = (
        sum(math.cos(r / 10000 ** (2 * k / d_prime)) for k in range(1, d_prime // 2 + 1))
        - d_prime / 2
    )
    table = sandwich_distance_table(40, d_prime)
    assert table[0] == 0 and table.dtype == torch.float64
    assert abs(float(table[r]) - want) < 1e-12


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: alibi_slopes(0), ValueError, "num_heads must be a positive integer"),
        (
            lambda: t5_relative_bucket(REL, True, 1, 128),
            ValueError,
            r"num_buckets must be an integer in \[2, 65536\]",
        ),
        (lambda: t5_relative_bucket(REL, True, 2, 128), ValueError, "num_buckets must be >= 4"),
        (
            lambda: t5_relative_bucket(REL, True, 32, 8),
            ValueError,
            r"above the exact-bucket range \(8",
        ),
        (lambda: t5_relative_bucket(REL, False, 32, 16), ValueError, r"exact-bucket range \(16"),
        (lambda: t5_relative_bucket(REL.float(), True), TypeError, "integer dtype"),
        (
            lambda: deberta_log_bucket(REL, 1, 512),
            ValueError,
            r"bucket_size must be an integer in \[2, 65536\]",
        ),
        (
            lambda: deberta_log_bucket(REL, 256, 129),
            ValueError,
            "max_position must be an integer above",
        ),
        (
            lambda: relative_position_matrix(torch.zeros(2, 3).long(), torch.zeros(3, 4).long()),
            ValueError,
            "same batch size",
        ),
        (
            lambda: relative_position_matrix(torch.zeros(2, 3, 1).long(), torch.zeros(4).long()),
            ValueError,
            "positions must be 1-D or 2-D",
        ),
        (lambda: sandwich_distance_table(10, 15), ValueError, "d_prime must be even"),
        # Found by tests/test_fuzz.py: allocations sized by an argument, Python or torch errors
        # that named nothing, a negative key_len that sliced silently.
        (lambda: alibi_slopes(2**40), ValueError, "num_heads must be <= 65536"),
        (lambda: sandwich_distance_table(10, 2**40), ValueError, "d_prime must be <= 2048"),
        (lambda: sandwich_distance_table(2**40, 16), ValueError, "max_distance must be <= "),
        (lambda: sandwich_distance_table(10, 8, math.nan), ValueError, "base must be a finite"),
        (lambda: kerple_log_bias([1, 2], torch.ones(2), torch.ones(2)), TypeError, "distance must"),
        (lambda: kerple_power_bias(REL, torch.ones(2), torch.ones(3)), ValueError, "r1 and r2"),
        (lambda: clipped_relative_index(REL, REL, 2**63), ValueError, "max_distance must be <="),
        (lambda: rel_shift(torch.zeros(2, 3, 4), -1), ValueError, r"key_len must be .* got -1"),
        (lambda: rel_shift(torch.zeros(2, 3, 4), None), ValueError, "key_len must be an integer"),
        (lambda: rel_shift([[0.0]], 1), TypeError, "x must be a tensor"),
        (lambda: sincos_2d(2**20, 2**20, 8), ValueError, r"grid_h \* grid_w \* dim must be"),
    ],
)
def test_bad_input(call, error, words) -> None:
    with pytest.raises(error, match=words):
        call()


def test_fire_distance_keeps_small_arguments_exact() -> None:
    """psi(x) = log(|c x| + 1) as log1p: float32 log(1 + 1e-4) kept only ~3 digits."""
    from posenc.functional import fire_normalized_distance

    c, big_l = torch.tensor(3e-5), torch.tensor(7.0)
    got = fire_normalized_distance(torch.tensor(0.0), torch.tensor(1.0), c, big_l, eps=1e-30)
    want = math.log1p(float(c)) / math.log1p(float(c) * 7.0)
    assert float(got) == pytest.approx(want, rel=1e-5)
