"""The base of the rotary family: one forward stanza and the Attention hook for every module.

A rotary module implements two steps, and :class:`RotaryEncoding` runs them::

    tables(q, k, positions, k_positions) -> T      positions checked, int64; the per-call product
    apply_tables(q, k, T) -> (q', k')                  the rotation itself

``forward(q, k, positions=None, k_positions=None)`` checks ``q``/``k``, resolves the positions
(defaults: ``arange``, the queries at the last ``s`` key positions) and runs both. A module with
decode plans (eager CPU calls of a layout seen before) serves a call from its plan
(:meth:`~RotaryEncoding.planned`) and keeps the plan of a checked one
(:meth:`~RotaryEncoding.keep_plan`): the one stanza for every module.
``prepare(q, k, ctx)``, the hook :class:`~posenc.attention.Attention` calls, takes the positions
from the forward's :class:`~posenc.attention.PositionContext` (checked there, once) and makes
``T`` once per forward: every layer sharing the module reuses its cos/sin.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple, TypeAlias

import torch
from torch import nn

from .._checks import check_positions, default_positions
from .._context import PositionContext
from ..kernels.canonical import qk_key, small_range
from ..kernels.rope_op import lookup

#: Positions as ``forward`` takes them (None: the defaults).
Positions: TypeAlias = torch.Tensor | None
#: Rotated ``(q', k')``.
QK: TypeAlias = tuple[torch.Tensor, torch.Tensor]


class CheckedCall(NamedTuple):
    """A call the checked path of ``forward`` ran, for :meth:`RotaryEncoding.keep_plan`: ``q``,
    ``k`` and the positions as the caller passed them, the :meth:`~RotaryEncoding.tables` it
    ran on, and its result ``out``."""

    q: torch.Tensor
    k: torch.Tensor
    tables: Any
    positions: torch.Tensor
    k_positions: Positions
    out: QK


class RotaryEncoding(nn.Module):
    """Base class of the rotary encodings (``family = "rotary"``): module docstring.

    Subclasses set ``head_dim`` and implement :meth:`tables` and :meth:`apply_tables` (and
    :meth:`resolve_positions` for other positions: MRoPE's ``[3, b, s]``); a subclass that writes
    its own ``forward`` instead gets a ``prepare`` that calls it.
    """

    family: ClassVar[str] = "rotary"
    head_dim: int
    _plans: Any  # a decode-planning subclass's plans by layout key (:meth:`plan_lookup`)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "forward" in cls.__dict__ and "tables" not in cls.__dict__:
            cls.prepare = RotaryEncoding.prepare_by_forward  # type: ignore[method-assign]

    def check_inputs(self, q: torch.Tensor, k: torch.Tensor) -> None:
        """Shape, dtype and device checks of ``forward``'s ``q`` and ``k``."""
        check_qk(q, k, self.head_dim)

    def plan_lookup(
        self, q: torch.Tensor, k: torch.Tensor, positions: Any, k_positions: Any, *options: Any
    ) -> tuple[tuple | None, Any]:
        """``(key, plan)`` of a decode-planning module's call: the layout's key
        (:func:`~posenc.kernels.canonical.qk_key` of the call and the module's ``options``; None
        where an argument is no tensor) and what ``self._plans`` keeps under it (None: nothing
        yet)."""
        return lookup(self._plans, qk_key(q, k, positions, k_positions, *options))

    def checks_position_values(self, q: torch.Tensor) -> bool:
        """Whether ``forward`` checks the positions' values (non-negative) as it resolves them;
        False where :meth:`tables` reads their range anyway (and checks it there)."""
        return True

    def tables(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, k_positions: torch.Tensor
    ) -> Any:
        """The call's product (cos/sin) from checked int64 ``positions [s]|[1|b, s]`` and
        ``k_positions [t]|[1|b, t]`` (``positions`` itself when shared); ``q``/``k`` give the
        device and dtypes only."""
        raise NotImplementedError

    def apply_tables(
        self, q: torch.Tensor, k: torch.Tensor, tables: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q [b, h, s, d]`` and ``k [b, hk, t, d]`` with :meth:`tables`' product."""
        raise NotImplementedError

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate queries and keys by their positions.

        Shapes: ``q [b, h, s, d]``, ``k [b, hk, t, d]`` (``hk`` may differ from ``h``: GQA);
        ``positions [s]`` or ``[b, s]`` and ``k_positions [t]`` or ``[b, t]``, integer. Defaults:
        ``arange``, with the queries at the last ``s`` key positions; ``k_positions`` defaults to
        ``positions`` when ``s == t``. Returns new ``(q', k')``, same shapes and dtypes.
        Inputs are checked once, here; an eager call of a layout that passed them before may
        run its decode plan instead (:meth:`planned`), whose kernel checks the positions.
        """
        key = None
        if not torch.compiler.is_compiling() and positions is not None:  # a traced call: no plans
            key, out = self.planned(q, k, positions, k_positions)
            if out is not None:
                return out
        self.check_inputs(q, k)
        pos, k_pos = self.resolve_positions(q, k, positions, k_positions)
        tables = self.tables(q, k, pos, k_pos)
        out = self.apply_tables(q, k, tables)
        if key is not None and positions is not None:
            self.keep_plan(key, CheckedCall(q, k, tables, positions, k_positions, out))
        return out

    def planned(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, k_positions: Positions
    ) -> tuple[tuple | None, QK | None]:
        """``(key, out)`` of an eager call with given positions: the key its layout's decode
        plan is kept under (None: no plan can be kept) and, where a plan for it ran, its result
        (None: the checked path runs, then :meth:`keep_plan`). No plans here."""
        return None, None

    def keep_plan(self, key: tuple, call: CheckedCall) -> None:
        """After the checked path ran a ``call`` :meth:`planned` gave ``key``: keep the plan of
        its layout for the next call. Nothing here."""

    def resolve_positions(
        self, q: torch.Tensor, k: torch.Tensor, positions: Positions, k_positions: Positions
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward``'s positions, defaulted and checked, as :meth:`tables` reads them
        (:func:`resolve_qk_positions`; MRoPE's take ``[3, b, s]`` too)."""
        values = self.checks_position_values(q)
        return resolve_qk_positions(q, k, positions, k_positions, check_values=values)

    def prepare(
        self, q: torch.Tensor, k: torch.Tensor, ctx: PositionContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention's hook: rotate by the context's positions, with tables made once per
        forward (and per dtype pair) for every layer that shares this module."""
        key = (self, "rotary", q.dtype, k.dtype, q.device)

        def make() -> Any:
            positions = as_int64(ctx.positions)
            shared = ctx.k_positions is ctx.positions
            k_positions = positions if shared else as_int64(ctx.k_positions)
            return self.tables(q, k, positions, k_positions)

        return self.apply_tables(q, k, ctx.product(key, make))

    def prepare_by_forward(
        self, q: torch.Tensor, k: torch.Tensor, ctx: PositionContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention's hook for a module with its own ``forward``: that forward, per layer."""
        return self(q, k, ctx.positions, k_positions=ctx.k_positions)


def as_int64(p: torch.Tensor) -> torch.Tensor:
    """int64 row indices: a uint8 index would be read as a mask, and the kernels read int64."""
    return p if p.dtype == torch.int64 else p.long()


def check_qk(q: torch.Tensor, k: torch.Tensor, head_dim: int) -> None:
    """``q [b, h, s, d]`` and ``k [b, hk, t, d]`` with ``d == head_dim``, floating point, on one
    device."""
    if not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor):
        raise TypeError(f"q and k must be tensors, got {type(q).__name__} and {type(k).__name__}")
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(
            "q and k must be 4-D [b, h, s, d] and [b, hk, t, d], "
            f"got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same head_dim, got {q.shape[-1]} and {k.shape[-1]}"
        )
    if q.shape[-1] != head_dim:
        raise ValueError(
            f"q and k must have head_dim {head_dim} (this encoding's), got {q.shape[-1]}"
        )
    if q.shape[0] != k.shape[0]:
        raise ValueError(
            f"q and k must have the same batch size, got {q.shape[0]} and {k.shape[0]}"
        )
    if not (q.is_floating_point() and k.is_floating_point()):
        raise TypeError(f"q and k must be floating point, got {q.dtype} and {k.dtype}")
    if q.device != k.device:
        raise ValueError(f"q and k must be on one device, got {q.device} and {k.device}")


def resolve_qk_positions(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor | None,
    k_positions: torch.Tensor | None,
    *,
    check_values: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions of the ``s`` queries and ``t`` keys, ``[s]``/``[b, s]`` and ``[t]``/``[b, t]``.

    Defaults: keys ``arange(t)`` and queries the last ``s`` of them (``arange(t - s, t)``), so
    ``s == t`` gives ``arange(s)`` for both; ``k_positions`` defaults to ``positions`` when
    ``s == t``. ``check_values=False`` leaves the non-negativity check to a caller that reads
    the positions' range anyway (:func:`position_range`).
    """
    b, s, t = q.shape[0], q.shape[2], k.shape[2]
    if positions is None:
        positions = default_positions(
            s, q.device, offset=max(t - s, 0) if k_positions is None else 0
        )
        given = False
    else:
        given = True
    positions = _check_pos(positions, "positions", b, s, check_values, q.device)
    if k_positions is None:
        if t == s:
            k_positions = positions
        elif not given:
            k_positions = default_positions(t, k.device)
        else:
            raise ValueError(
                f"k has {t} keys but q has {s} queries: pass k_positions ([{t}] or [{b}, {t}])"
            )
    else:
        k_positions = _check_pos(k_positions, "k_positions", b, t, check_values, q.device)
    return positions, k_positions


def _check_pos(
    p: torch.Tensor, name: str, b: int, n: int, values: bool, device: torch.device
) -> torch.Tensor:
    p = check_positions(p, name, ranks=(1, 2), allow_negative=not values, device=device)
    if p.shape[-1] != n or (p.dim() == 2 and p.shape[0] not in (1, b)):
        raise ValueError(f"{name} must be [{n}] or [{b}, {n}], got {list(p.shape)}")
    return as_int64(p)


def position_range(positions: torch.Tensor, k_positions: torch.Tensor) -> int:
    """The largest of the query and key positions (-1 when both are empty), after checking that
    none is negative: one read of each tensor's range (one in all when ``k_positions`` is
    ``positions``, as at a decode step). Call it only where reading values is free
    (:func:`posenc._checks.host_readable`)."""
    high = _checked_range("positions", positions)
    if k_positions is not positions:
        high = max(high, _checked_range("k_positions", k_positions))
    return high


def _checked_range(name: str, p: torch.Tensor) -> int:
    """The largest value of ``p`` (-1 when empty); ValueError when one is negative."""
    if not p.numel():
        return -1
    if p.numel() <= 64:  # a decode step: a list is cheaper than a reduction kernel
        low, high = small_range(p)
    else:
        mn, mx = p.aminmax()
        low, high = int(mn), int(mx)
    if low < 0:
        raise ValueError(f"{name} must be non-negative, got minimum {low}")
    return high


def max_position(*positions: torch.Tensor) -> int:
    """The largest position of the tensors, -1 when all are empty. A host read: call it only
    where reading is free (:func:`posenc._checks.host_readable`)."""
    return max((int(p.max()) for p in positions if p.numel()), default=-1)
