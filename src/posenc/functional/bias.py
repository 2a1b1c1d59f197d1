"""Relative-position arithmetic for the bias and relative families: the parity points.

Two sign conventions exist in the literature and both are kept, each where its model uses it:

* T5 (and every bias here): ``relative_position = key - query`` (``memory - context``), so a key
  in the past has a negative relative position.
* DeBERTa: ``relative_position = query - key``.

:func:`relative_position_matrix` gives T5's ``key - query``; negate it for DeBERTa.

Bucketing reproduces the published float32 arithmetic operation for operation (float32 ``log``
of a float32 ratio, truncation or ``ceil``): the bucket edges of a trained model are wherever
those float32 operations put them, so a float64 re-derivation could move a distance across an
edge.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .._checks import check_int_in, check_number, check_positions, check_positive_int

# The most rows a table sized by an option may have (T5's buckets and clamped distances, Shaw's
# and DeBERTa's relative embeddings, Sandwich's cached distances): a larger option is an error
# naming it, not an allocation that fails (or swaps) far from the cause. Tables are indexed by
# clamped offsets, never by position values, so no position needs a longer one.
MAX_TABLE_ROWS = 1 << 16
# Sandwich's d' beyond this is no sinusoidal width any model uses; it sizes [n, d'/2] float64
# products and the d'/2 terms a FlexAttention score_mod unrolls.
MAX_D_PRIME = 2048
# The most values a float64 intermediate sized by an argument may hold (2 GiB).
MAX_INTERMEDIATE = 1 << 28

__all__ = [
    "MAX_D_PRIME",
    "MAX_TABLE_ROWS",
    "alibi_slopes",
    "check_pair",
    "deberta_log_bucket",
    "deberta_log_bucket_of",
    "fire_normalized_distance",
    "kerple_log",
    "kerple_log_bias",
    "kerple_power",
    "kerple_power_bias",
    "relative_distances",
    "relative_position_matrix",
    "sandwich_distance_table",
    "sandwich_embedding",
    "sandwich_inv_freq",
    "t5_relative_bucket",
]


def check_pair(
    positions: torch.Tensor,
    k_positions: torch.Tensor,
    device: torch.device | None = None,
    device_of: str = "q",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate query/key positions: integer, ``[s]`` or ``[b, s]``, batch sizes that broadcast,
    on one device (``device``, that of ``device_of``, when given)."""
    q = check_positions(positions, "positions", ranks=(1, 2), device=device, device_of=device_of)
    if device is None:
        device, device_of = q.device, "positions"
    k = check_positions(
        k_positions, "k_positions", ranks=(1, 2), device=device, device_of=device_of
    )
    if (
        q.dim() == 2
        and k.dim() == 2
        and q.shape[0] != k.shape[0]
        and 1 not in (q.shape[0], k.shape[0])
    ):
        raise ValueError(
            "positions [b, s] and k_positions [b, t] must have the same batch size (or 1), got "
            f"{list(q.shape)} and {list(k.shape)}"
        )
    return q, k


def relative_position_matrix(positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """``key - query`` for every (query, key) pair, int64.

    Shapes: ``positions [s]`` (queries) and ``k_positions [t]`` (keys) -> ``[s, t]``; if either is
    ``[b, *]`` (``[1, *]`` broadcasts) -> ``[b, s, t]``. Entry
    ``[.., i, j] = k_positions[j] - positions[i]``.
    """
    q, k = check_pair(positions, k_positions)
    return relative_distances(q, k)


def relative_distances(positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """:func:`relative_position_matrix` of positions already checked (a
    :class:`~posenc.attention.PositionContext`'s): same shapes and result, no validation.
    """
    q, k = positions.long(), k_positions.long()
    if q.dim() == k.dim() == 1:
        return k[None, :] - q[:, None]  # [s, t]
    q = q if q.dim() == 2 else q[None]  # [b|1, s]
    k = k if k.dim() == 2 else k[None]  # [b|1, t]
    return k[:, None, :] - q[:, :, None]  # [b, s, t]


# --- ALiBi -------------------------------------------------------------------------------------


def alibi_slopes(
    num_heads: int,
    dtype: torch.dtype = torch.float32,
    *,
    slopes: torch.Tensor | Sequence[float] | None = None,
) -> torch.Tensor:
    """ALiBi head slopes (Press et al., 2022), ``[h]``.

    For ``n`` a power of two the slopes are the geometric sequence ``2^(-8/n), 2^(-16/n), ...,
    2^(-8)``. Otherwise take the ``2^floor(log2 n)`` slopes of the nearest lower power of two and
    fill up with every other slope (the 1st, 3rd, 5th, ...) of the next power of two, which
    interleaves the extra heads between the existing ones. Computed in float64, rounded once.

    ``slopes`` (a tensor or sequence of ``num_heads`` finite real numbers) replaces the paper's:
    custom or trained slopes, e.g. a checkpoint's; they are validated and returned in ``dtype``.
    """
    check_positive_int("num_heads", num_heads)
    if num_heads > MAX_TABLE_ROWS:
        raise ValueError(
            f"num_heads must be <= {MAX_TABLE_ROWS} (one slope per head), got {num_heads}"
        )
    if slopes is not None:
        return _custom_slopes(num_heads, slopes).to(dtype)

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** math.floor(math.log2(num_heads))
    paper = power_of_two(closest)
    if closest != num_heads:
        paper += power_of_two(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(paper, dtype=torch.float64).to(dtype)


def _custom_slopes(num_heads: int, slopes: torch.Tensor | Sequence[float]) -> torch.Tensor:
    """``slopes`` checked (``[num_heads]``, finite, real) as a float64 CPU tensor."""
    allowed = f"a tensor or sequence of num_heads = {num_heads} finite real numbers"
    if isinstance(slopes, torch.Tensor):
        if slopes.dtype == torch.bool or slopes.is_complex():
            raise ValueError(f"slopes must be {allowed}, got a {slopes.dtype} tensor")
        values = slopes.detach().to("cpu", torch.float64)
    else:
        if isinstance(slopes, (str, bytes)) or not isinstance(slopes, Sequence):
            raise ValueError(f"slopes must be {allowed}, got {type(slopes).__name__}")
        bad = [v for v in slopes if isinstance(v, bool) or not isinstance(v, (int, float))]
        if bad:
            raise ValueError(f"slopes must be {allowed}, got {bad[0]!r} among them")
        values = torch.tensor([float(v) for v in slopes], dtype=torch.float64)
    if values.dim() != 1 or values.shape[0] != num_heads:
        raise ValueError(f"slopes must be {allowed}, got shape {list(values.shape)}")
    if not bool(torch.isfinite(values).all()):
        raise ValueError(f"slopes must be {allowed}, got {values.tolist()}")
    return values


# --- T5 ----------------------------------------------------------------------------------------


def _check_int_tensor(name: str, x: object) -> torch.Tensor:
    return check_positions(x, name, allow_negative=True)


def t5_bucket_layout(bidirectional: bool, num_buckets: int, max_distance: int) -> tuple[int, int]:
    """Validate T5 bucket options; return ``(buckets per direction, exact buckets)``."""
    check_int_in("num_buckets", num_buckets, 2, MAX_TABLE_ROWS)
    per_side = num_buckets // 2 if bidirectional else num_buckets
    if per_side < 2:
        raise ValueError(
            f"num_buckets must be >= 4 for bidirectional buckets (half of them per direction, "
            f"half of those exact), got {num_buckets}"
        )
    max_exact = per_side // 2
    if (
        isinstance(max_distance, bool)
        or not isinstance(max_distance, int)
        or not max_exact < max_distance <= MAX_TABLE_ROWS
    ):
        raise ValueError(
            f"max_distance must be an integer above the exact-bucket range ({max_exact} for "
            f"num_buckets={num_buckets}, bidirectional={bidirectional}) and at most "
            f"{MAX_TABLE_ROWS}, got {max_distance!r}"
        )
    return per_side, max_exact


def t5_relative_bucket(
    relative_position: torch.Tensor,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> torch.Tensor:
    """T5's bucket of each relative position (``key - query``), int64, same shape.

    Bidirectional: half the buckets for keys after the query (``relative_position > 0``), half
    for the rest. Per direction (``n`` buckets), distances ``0 .. n/2 - 1`` get a bucket each;
    larger ones share ``n/2`` log-spaced buckets up to ``max_distance``; everything at or beyond
    ``max_distance`` lands in the last bucket. Causal (``bidirectional=False``): keys after the
    query all map to bucket 0 (they are masked anyway).
    """
    rel = _check_int_tensor("relative_position", relative_position).long()
    n, max_exact = t5_bucket_layout(bidirectional, num_buckets, max_distance)
    buckets = torch.zeros_like(rel)
    if bidirectional:
        buckets = buckets + (rel > 0).long() * n
        dist = rel.abs()
    else:
        dist = (-rel).clamp(min=0)
    # Same float32 operations as Mesh TensorFlow / transformers, so bucket edges match exactly.
    large = max_exact + (
        torch.log(dist.float() / max_exact) / math.log(max_distance / max_exact) * (n - max_exact)
    ).to(torch.long)
    large = large.clamp(max=n - 1)  # log(0) = -inf -> long is garbage, but masked by `where`
    return buckets + torch.where(dist < max_exact, dist, large)


# --- DeBERTa -----------------------------------------------------------------------------------


def deberta_check_buckets(
    bucket_size: int,
    max_position: int,
    names: tuple[str, str] = ("bucket_size", "max_position"),
) -> int:
    """Validate DeBERTa log-bucket options; return ``mid = bucket_size // 2``. ``names``: what
    the caller calls the two options (errors name them)."""
    check_int_in(names[0], bucket_size, 2, MAX_TABLE_ROWS)
    mid = bucket_size // 2
    if (
        isinstance(max_position, bool)
        or not isinstance(max_position, int)
        or max_position - 1 <= mid
    ):
        raise ValueError(
            f"{names[1]} must be an integer above {names[0]} // 2 + 1 = {mid + 1} (the "
            f"log range starts there), got {max_position!r}"
        )
    return mid


def deberta_log_bucket(
    relative_position: torch.Tensor, bucket_size: int, max_position: int
) -> torch.Tensor:
    """DeBERTa-v2's log bucket of each relative position (``query - key``), int64, same shape.

    ``|r| <= bucket_size // 2`` stays exact; larger distances are log-compressed so that
    ``max_position - 1`` maps to ``±(bucket_size - 1)``. Odd in ``r``: ``bucket(-r) = -bucket(r)``.
    """
    rel = _check_int_tensor("relative_position", relative_position)
    return deberta_log_bucket_of(
        rel, deberta_check_buckets(bucket_size, max_position), max_position
    )


def deberta_log_bucket_of(rel: torch.Tensor, mid: int, max_position: int) -> torch.Tensor:
    """:func:`deberta_log_bucket` of an integer ``rel`` already checked (or made from checked
    positions), with ``mid = bucket_size // 2`` from :func:`deberta_check_buckets`; no validation.
    """
    sign = torch.sign(rel)
    # Inside the exact range the log branch is unused: feed it mid - 1 to keep log finite.
    abs_pos = torch.where((rel < mid) & (rel > -mid), torch.full_like(rel, mid - 1), rel.abs())
    # Same float32 operations as the reference implementation (ceil makes edges sensitive).
    log_pos = (
        torch.ceil(
            torch.log(abs_pos / mid) / torch.log(torch.tensor((max_position - 1) / mid)) * (mid - 1)
        )
        + mid
    )
    bucket = torch.where(abs_pos <= mid, rel.to(log_pos.dtype), log_pos * sign)
    return bucket.long()


# --- KERPLE ------------------------------------------------------------------------------------


def kerple_log(distance: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor) -> torch.Tensor:
    """KERPLE's log kernel entry by entry, ``-r1 * log(1 + r2 * |distance|)``, broadcasting.

    The one statement of the formula: :func:`kerple_log_bias` (a whole ``[h, *]`` bias) and the
    FlexAttention ``score_mod`` (one entry, ``r1[h]``) both call it.
    """
    return -r1 * torch.log1p(r2 * distance.abs().to(r1.dtype))


def _per_head(distance: object, r1: object, r2: object) -> tuple[int, ...]:
    """Check a kernel's arguments (``distance`` a tensor, ``r1, r2 [h]`` floating); return the
    view that puts ``[h]`` in front of ``distance``'s dims."""
    if not isinstance(distance, torch.Tensor):
        raise TypeError(f"distance must be a tensor, got {type(distance).__name__}")
    for name, r in (("r1", r1), ("r2", r2)):
        if not isinstance(r, torch.Tensor) or not r.is_floating_point() or r.dim() != 1:
            raise TypeError(f"{name} must be a 1-D floating tensor [h], got {r!r:.60}")
    assert isinstance(r1, torch.Tensor) and isinstance(r2, torch.Tensor)
    if r1.shape != r2.shape:
        raise ValueError(f"r1 and r2 must both be [h], got {list(r1.shape)} and {list(r2.shape)}")
    return (-1,) + (1,) * distance.dim()


def kerple_power(distance: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor) -> torch.Tensor:
    """KERPLE's power kernel entry by entry, ``-r1 * |distance| ** r2``, broadcasting.

    Far distances (``|i - j|`` up to ``2**63``) would overflow to ``-inf`` for large ``r1``, and
    a row of ``-inf`` is a NaN softmax: the result stops at the most negative finite value of
    its dtype instead (the nearest representable value of the formula).
    """
    out = -r1 * distance.abs().to(r1.dtype).pow(r2)
    return out.clamp(min=torch.finfo(out.dtype).min)


def kerple_log_bias(distance: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor) -> torch.Tensor:
    """KERPLE log kernel ``-r1 * log(1 + r2 * |distance|)`` (Chi et al., 2022).

    Shapes: ``distance [*]`` (any integer or float), ``r1, r2 [h]`` -> ``[h, *]``.
    """
    view = _per_head(distance, r1, r2)
    return kerple_log(distance, r1.view(view), r2.view(view))  # [h, *]


def kerple_power_bias(distance: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor) -> torch.Tensor:
    """KERPLE power kernel ``-r1 * |distance| ** r2`` (Chi et al., 2022), ``0 < r2 <= 2``.

    Shapes: ``distance [*]``, ``r1, r2 [h]`` -> ``[h, *]``.
    """
    view = _per_head(distance, r1, r2)
    return kerple_power(distance, r1.view(view), r2.view(view))  # [h, *]


# --- FIRE --------------------------------------------------------------------------------------


def fire_normalized_distance(
    positions: torch.Tensor,
    distance: torch.Tensor,
    c: torch.Tensor,
    threshold: torch.Tensor,
    eps: float = 1e-6,
) -> torch.Tensor:
    """FIRE's input ``psi(i - j) / psi(max(L, i))`` with ``psi(x) = log(|c x| + 1)`` (Li et al., 2024).

    ``positions`` is the query position ``i`` and ``distance`` is ``i - j`` (broadcastable float
    tensors); ``c`` and the threshold ``L`` are scalars. ``eps`` keeps the denominator positive.
    """
    # log1p(y) is log(y + 1) without the rounding of y + 1 (float32 kept ~1e-3 of log(1 + 1e-4))
    num = torch.log1p(torch.abs(c * distance))
    den = torch.log1p(torch.abs(c * torch.maximum(positions, threshold))) + eps
    return num / den


# --- Sandwich ----------------------------------------------------------------------------------


def sandwich_inv_freq(
    d_prime: int, base: float = 10000.0, device: torch.device | str | None = None
) -> torch.Tensor:
    """Sandwich's ``d'/2`` frequencies ``base ** (-2k / d')`` for ``k = 1 .. d'/2``, float64.

    ``k`` starts at 1: ``k = 0`` would add the constant ``cos(0) = 1`` to every entry. Computed
    on ``device`` (no host-to-device copy: capture-safe).
    """
    check_positive_int("d_prime", d_prime)
    if d_prime > MAX_D_PRIME:
        raise ValueError(f"d_prime must be <= {MAX_D_PRIME} (a sinusoidal width), got {d_prime}")
    if d_prime % 2:
        raise ValueError(f"d_prime must be even for Sandwich (d'/2 frequencies), got {d_prime}")
    base = check_number("base", base, low=1.0, low_open=True)
    k = torch.arange(1, d_prime // 2 + 1, dtype=torch.float64, device=device)
    return base ** (-2.0 * k / d_prime)  # [d'/2]


def sandwich_distance_table(
    max_distance: int,
    d_prime: int,
    base: float = 10000.0,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Sandwich's head-independent bias for distances ``0 .. max_distance``, float64 ``[max_distance + 1]``.

    ``B(r) = sum_{k=1}^{d'/2} cos(r / base^(2k/d')) - d'/2`` (Chi et al., 2023): the dot product
    of two sinusoidal embeddings ``p_m . p_n`` depends on ``r = m - n`` only, and subtracting
    ``d'/2`` makes it 0 at ``r = 0`` and negative elsewhere. Even in ``r``, so a table over
    ``|r|`` serves both directions. Each head then divides it by its compression ratio.
    Computed on ``device``. For positions in general the module computes the same sum as a dot
    product of :func:`sandwich_embedding` s, whose cost does not depend on the position values.
    """
    inv_freq = sandwich_inv_freq(d_prime, base, device)  # [d'/2], validates d_prime
    check_int_in("max_distance", max_distance, 0)
    limit = MAX_INTERMEDIATE // (d_prime // 2) - 1
    if max_distance > limit:
        raise ValueError(
            f"max_distance must be <= {limit} for d_prime={d_prime} (the table comes from a "
            f"[max_distance + 1, d'/2] float64 product of at most 2**28 values), got {max_distance}"
        )
    r = torch.arange(max_distance + 1, dtype=torch.float64, device=device)
    return torch.cos(r[:, None] * inv_freq).sum(-1) - d_prime // 2  # [max_distance + 1]


def sandwich_embedding(
    positions: torch.Tensor,
    d_prime: int,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The sinusoidal embedding whose dot products are Sandwich's bias, ``[*] -> [*, d']``.

    ``e(p) = [cos(p f_1) .. cos(p f_{d'/2}) | sin(p f_1) .. sin(p f_{d'/2})]`` with ``f_k`` from
    :func:`sandwich_inv_freq`, so that ``e(m) . e(n) = sum_k cos((m - n) f_k)``
    (``cos a cos b + sin a sin b = cos(a - b)``) and ``B(m - n) = e(m) . e(n) - d'/2``. Angles in
    float64 from the integer positions, rounded once to ``dtype``.
    """
    positions = check_positions(positions, allow_negative=True)
    inv_freq = sandwich_inv_freq(d_prime, base, positions.device)  # [d'/2]
    angles = positions.to(torch.float64)[..., None] * inv_freq  # [*, d'/2]
    return torch.cat((angles.cos(), angles.sin()), dim=-1).to(dtype)  # [*, d']


def bias_in_dtype(
    bias: torch.Tensor, dtype: torch.dtype, keep: torch.Tensor | None = None
) -> torch.Tensor:
    """A float32 bias in the attention's ``dtype``, masked where ``keep`` is False (``-inf``).

    Below float32 (float16, bfloat16) each row is first shifted by its largest visible entry:
    softmax is unchanged by a per-row constant, and a row whose keys are all far (ALiBi at
    distance 2e5: -1e5, below float16's -65504) stays finite instead of turning to -inf (a wrong
    row on SDPA, NaN on the explicit path). Shapes: ``bias [(b,) h, s, t]``, ``keep`` broadcast
    against it; returns the broadcast shape in ``dtype``. No value is read back to the host.
    """
    if keep is not None:
        bias = torch.where(keep, bias, float("-inf"))  # [(b,) h, s, t]
    if dtype in (torch.float16, torch.bfloat16):
        top = bias.detach().amax(dim=-1, keepdim=True)  # [(b,) h, s, 1]
        bias = bias - torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    return bias.to(dtype)
