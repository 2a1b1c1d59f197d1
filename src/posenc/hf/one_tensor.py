"""posenc's stand-ins for the rotations of one tensor at a time.

* ``stock(x, cos, sin, unsqueeze_dim=1)`` (:func:`one_tensor_rotation`): DeepSeek-V4's trailing
  channels, Gemma-3n's leading ones.
* ``apply_rotary_pos_emb(q, k=None, cos=None, sin=None, unsqueeze_dim=1)`` (Qwen4-exp): ``q`` and
  ``k`` in its attention, one tensor alone in its indexer (queries ``[b, h, s, d]`` or
  ``[b, s, h, d]``, pooled keys ``[n, 1, d]`` against tables ``[n, w]``), returning a pair or one
  tensor. :func:`optional_k_rotation` is the stand-in with both forms (the pair as
:func:`posenc.hf.patch.fused_rotation` computes it, one tensor by :func:`rotate_alone`);
:func:`one_tensor_forms` gives the one-tensor calls ``check_rotation`` probes beside the pair.
Shapes: ``x [..., d]``, tables ``[..., w]`` with ``w <= d`` (channels past ``w`` pass).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from .rotary import apply_rotary_emb, apply_rotary_trailing
from .supported import Rotation


def one_tensor_rotation(rotation: Rotation, backend: str) -> Callable[..., torch.Tensor]:
    """The stand-in for a one-tensor ``stock(x, cos, sin, unsqueeze_dim=1)`` that rotates the
    trailing channels (:func:`posenc.hf.rotary.apply_rotary_trailing`) or the leading ones
    (:func:`posenc.hf.rotary.apply_rotary_emb`; Gemma-3n)."""

    def rotate(
        x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1
    ) -> torch.Tensor:
        if rotation.trailing:
            return apply_rotary_trailing(
                x, cos, sin, unsqueeze_dim, interleaved=rotation.interleaved,
                table_layout=rotation.table_layout, backend=backend,
            )  # fmt: skip
        if unsqueeze_dim not in (1, 2):
            raise ValueError(f"unsqueeze_dim must be 1 or 2, got {unsqueeze_dim!r}")
        return rotate_alone(rotation, x, cos, sin, unsqueeze_dim, backend)

    return rotate


def optional_k_rotation(
    rotation: Rotation, stock: Callable[..., Any], pair: Callable[..., Any], backend: str
) -> Callable[..., tuple[torch.Tensor, torch.Tensor] | torch.Tensor]:
    """The stand-in for ``stock``: with k, ``pair(q, k, cos, sin, unsqueeze_dim=)`` (``(q', k')``);
    without, ``q'`` alone, as the stock function returns it. Arguments are read by ``stock``'s
    own names."""
    signature = inspect.signature(stock)
    q_name, k_name, cos_name, sin_name = list(signature.parameters)[:4]

    def rotate(*args: Any, **kw: Any) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
        if len(args) == 4 and not kw and args[1] is not None:  # the attention's (q, k, cos, sin)
            return pair(*args)  # type: ignore[no-any-return]
        given = signature.bind(*args, **kw).arguments
        q, k, cos, sin = (given.get(n) for n in (q_name, k_name, cos_name, sin_name))
        unsqueeze_dim = given.get("unsqueeze_dim", 1)
        if q is None or cos is None or sin is None:
            raise TypeError(f"posenc_{stock.__name__} needs {q_name}, {cos_name} and {sin_name}")
        if k is not None:
            return pair(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)  # type: ignore[no-any-return]
        return rotate_alone(rotation, q, cos, sin, unsqueeze_dim, backend)

    return rotate


def rotate_alone(
    rotation: Rotation,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    unsqueeze_dim: int,
    backend: str,
) -> torch.Tensor:
    """``x`` rotated by ``cos.unsqueeze(unsqueeze_dim)``, ``sin.unsqueeze(...)`` broadcast
    against it, as transformers' ``x * cos + rotate_half(x) * sin`` broadcasts (channels past
    the tables' width pass). ``x [b, h, s, d]`` / ``[b, s, h, d]`` with per-token tables
    ``[b or 1, s, w]`` is one kernel call as it lies; any other broadcast (Qwen4-exp's pooled
    keys ``[n, 1, d]`` against ``[n, w]``) is laid out as one table row per row of x first."""
    pairs, table = rotation.interleaved, rotation.table_layout
    if rotation.clockwise:
        sin = -sin
    if x.dim() == 4 and cos.dim() == 3 and unsqueeze_dim in (1, 2):
        layout = "bhsd" if unsqueeze_dim == 1 else "bshd"
        return apply_rotary_emb(
            x, cos, sin, interleaved=pairs, table_layout=table, seq_layout=layout, backend=backend
        )
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    rows = torch.broadcast_shapes(x.shape[:-1], cos.shape[:-1])  # what the stock result has
    w, d = cos.shape[-1], x.shape[-1]
    cos_rows = cos.expand(*rows, w).reshape(1, -1, w)  # [1, N, w]: the row of each x row
    sin_rows = sin.expand(*rows, w).reshape(1, -1, w)
    out = apply_rotary_emb(
        x.expand(*rows, d).reshape(1, -1, 1, d), cos_rows, sin_rows, interleaved=pairs,
        table_layout=table, seq_layout="bshd", backend=backend,
    )  # fmt: skip
    return out.reshape(*rows, d)


def one_tensor_forms(
    f: Callable[..., Any], q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """``f(q, k=None, cos, sin, ...)`` on one tensor, in the forms Qwen4-exp's indexer calls:
    ``q [b, h, s, d]``; ``[b, s, h, d]`` with ``unsqueeze_dim=2``; rows ``[n, 1, d]`` against
    tables ``[n, w]`` (its pooled keys)."""
    rows = q[:, :1].reshape(-1, 1, q.shape[-1])  # [b * s, 1, d]
    return (
        f(q, cos=cos, sin=sin),
        f(q.transpose(1, 2), cos=cos, sin=sin, unsqueeze_dim=2),
        f(rows, cos=cos.reshape(-1, cos.shape[-1]), sin=sin.reshape(-1, sin.shape[-1])),
    )
