"""Training-time position samplers for length generalization: train on ``L`` tokens with the
positions of a longer context, so that the positions (and distances) seen at test time were seen
in training. Pure functions returning integer ``position_ids [b, L]`` for any encoding's
``positions`` argument; the tokens stay the ``L`` contiguous training tokens.

* :func:`randomized_positions`: Ruoss et al. (2023), "Randomized Positional Encodings Boost
  Length Generalization of Transformers", Section 3: the ``L`` positions are a uniformly random
  subset of ``{0, ..., max_len - 1}``, sorted ascending (``max_len`` >= the longest test length).
* :func:`pose_positions`: Zhu et al. (2024), "PoSE: Efficient Context Window Extension of LLMs via
  Positional Skip-wise Training", Section 3.2: the ``L`` positions are cut into ``N`` chunks and
  chunk ``i`` is shifted by a skip ``u_i ~ U({u_{i-1}, ..., L_t - L})``, ``u_0 = 0``, so the
  positions span up to the target length ``L_t``. :func:`pose_positions_from` is the
  deterministic part (Eq. 3-4) for given chunk lengths and skips.

Randomness comes from an explicit ``torch.Generator`` (CPU), drawn in the documented order, so a
seeded generator gives the same positions on every machine; the result is moved to ``device``.
"""

from __future__ import annotations

import torch

from .._checks import check_positive_int

__all__ = ["pose_positions", "pose_positions_from", "randomized_positions"]


def _check_sizes(batch: int, length: int, limit: int, limit_name: str) -> None:
    check_positive_int("batch", batch)
    check_positive_int("length", length)
    check_positive_int(limit_name, limit)
    if limit < length:
        raise ValueError(
            f"{limit_name} must be >= length ({length}): the {length} training positions are "
            f"drawn from [0, {limit_name}), got {limit_name}={limit}"
        )


def randomized_positions(
    batch: int,
    length: int,
    max_len: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Ruoss et al. (2023): ``length`` distinct positions from ``[0, max_len)``, uniformly, sorted.

    Each row is an independent uniform ``length``-subset (the authors draw one subset per batch;
    per row is the same distribution with more variety). ``max_len == length`` gives ``arange``.
    Draws ``torch.rand(batch, max_len)`` (float64) from ``generator``: the ``length`` largest of
    iid uniforms sit at a uniformly random subset of indices.

    Shapes: -> ``[batch, length]`` int64, strictly increasing along the row.
    """
    _check_sizes(batch, length, max_len, "max_len")
    keys = torch.rand(batch, max_len, generator=generator, dtype=torch.float64)  # [b, max_len]
    chosen = keys.topk(length, dim=-1, sorted=False).indices  # [b, length], distinct per row
    return chosen.sort(dim=-1).values.to(device=device, dtype=torch.long)


def pose_positions_from(chunk_lengths: torch.Tensor, skips: torch.Tensor) -> torch.Tensor:
    """PoSE Eq. 3-4: chunk ``i`` (lengths ``l``) has ``{u_i + st_i, ..., u_i + st_i + l_i - 1}``,
    ``st_i = l_0 + ... + l_{i-1}``: token ``n`` of chunk ``i`` gets ``n + u_i``.

    Shapes: ``chunk_lengths [b, N]`` positive integers, ``skips [b, N]`` non-decreasing integers
    -> ``[b, sum(l)]`` int64 (every row's lengths must sum to the same ``L``).
    """
    if chunk_lengths.dim() != 2 or skips.shape != chunk_lengths.shape:
        raise ValueError(
            f"chunk_lengths and skips must both be [b, N], got {list(chunk_lengths.shape)} and "
            f"{list(skips.shape)}"
        )
    for name, t in (("chunk_lengths", chunk_lengths), ("skips", skips)):
        if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor, got {t.dtype}")
    ends = chunk_lengths.long().cumsum(-1)  # [b, N]: st_{i+1}
    length = int(ends[0, -1])  # host read: sampling runs in data preparation, not in a forward
    if bool((ends[:, -1] != length).any()) or bool((chunk_lengths < 1).any()):
        raise ValueError("chunk_lengths must be positive and sum to the same length in every row")
    n = torch.arange(length, device=ends.device).repeat(ends.shape[0], 1)  # [b, L]
    chunk = torch.searchsorted(ends, n, right=True)  # [b, L]: chunk of token n
    return n + skips.long().gather(-1, chunk)  # [b, L]


def pose_positions(
    batch: int,
    length: int,
    target_len: int,
    num_chunks: int = 2,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """PoSE (Zhu et al. 2024, Section 3.2): ``length`` training positions covering ``target_len``.

    Per row: ``num_chunks - 1`` distinct cut points, uniform in ``{1, ..., length - 1}`` (every
    chunk non-empty), give the chunk lengths; then ``u_0 = 0`` and, for ``i >= 1``,
    ``u_i ~ U({u_{i-1}, ..., target_len - length})``; positions by :func:`pose_positions_from`.
    The first chunk starts at 0, positions increase strictly and stay below ``target_len``.
    ``num_chunks = 2`` is the paper's default (more chunks cover long distances better and
    depart further from pre-training, Appendix B).

    Draws from ``generator``, in order: ``torch.rand(batch, length - 1)`` (float64; the cut points
    are the indices + 1 of the ``num_chunks - 1`` largest), then ``torch.rand(batch,
    num_chunks - 1)`` (float64; ``u_i = u_{i-1} + floor(r_i * (target_len - length - u_{i-1} + 1))``).

    Shapes: -> ``[batch, length]`` int64.
    """
    _check_sizes(batch, length, target_len, "target_len")
    check_positive_int("num_chunks", num_chunks)
    if num_chunks > length:
        raise ValueError(
            f"num_chunks must be <= length ({length}): every chunk holds a token, got {num_chunks}"
        )
    keys = torch.rand(batch, length - 1, generator=generator, dtype=torch.float64)  # [b, L - 1]
    cuts = keys.topk(num_chunks - 1, dim=-1).indices.sort(-1).values + 1  # [b, N - 1]
    bounds = torch.cat(
        (cuts.new_zeros(batch, 1), cuts, cuts.new_full((batch, 1), length)), dim=-1
    )  # [b, N + 1]: 0, cuts..., L
    lengths = bounds.diff(dim=-1)  # [b, N]
    r = torch.rand(batch, num_chunks - 1, generator=generator, dtype=torch.float64)  # [b, N - 1]
    skips = torch.zeros(batch, num_chunks, dtype=torch.long)  # u_0 = 0
    for i in range(1, num_chunks):
        room = target_len - length - skips[:, i - 1] + 1  # |{u_{i-1}, ..., L_t - L}|
        step = (r[:, i - 1] * room).floor().long().clamp(max=room - 1)  # [b]
        skips[:, i] = skips[:, i - 1] + step
    return pose_positions_from(lengths, skips).to(device)
