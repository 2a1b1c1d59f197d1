"""The checks of :func:`~posenc.kernels.rope_op.rope_qk`'s inputs, and their canonical form.

Every accepted input form (``[b, h, s, d]``, ``[b, s, h, d]``, packed ``[total, h, d]`` with
``cu_seqlens``; tables ``[n, r/2]`` or ``[1 or b, n, r/2]``; positions ``[s]`` or ``[b, s]``)
becomes one :class:`~posenc.kernels.reference.RopeArgs`: ``q [b, h, s, d]`` views, float
tables ``[1 or b, n, r/2]`` and int positions ``[1 or b, s]`` (or None for row i = position i).

Shapes: ``b`` batch, ``h`` query heads, ``hk`` key heads, ``s`` query length, ``t`` key length,
``d`` head_dim, ``r`` rotary_dim, ``n`` table rows, ``total`` packed tokens.
"""

from __future__ import annotations

import torch

from .._checks import check_device, check_values, host_readable
from .constants import SEQ_LAYOUTS
from .reference import RopeArgs

#: A rotation call's tensors in :func:`~posenc.kernels.rope_op.rope_qk`'s order: ``(q, k, cos,
#: sin, cos_k, sin_k, positions, k_positions)`` (the last four may be None). The checks, the
#: plan key and the canonical form read them as one tuple, as ``rope_qk`` passes them on.
Given = tuple[
    torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
    torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None,
]  # fmt: skip


def check_kernel_tensor(
    name: str, t: torch.Tensor, kernel: str, device: torch.device | str, dtypes: tuple
) -> None:
    """A kernel launcher's check of one of its ``[b, h, s, d]`` inputs or outputs: on ``device``
    (a device, or a device type such as ``"cpu"``), 4-D, one of ``dtypes``, a unit stride on d."""
    if (t.device.type if isinstance(device, str) else t.device) != device:
        raise ValueError(f"{name} must be on {device} for the {kernel}, got {t.device}")
    if t.dim() != 4:
        raise ValueError(f"{name} must be 4-D [b, h, s, d], got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        *most, last = (str(d).removeprefix("torch.") for d in dtypes)
        names = f"{', '.join(most)} or {last}" if most else last  # "float32 or bfloat16"
        raise TypeError(f"{name} must be {names} for the {kernel}, got {t.dtype}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a unit stride on head_dim, got strides {t.stride()}")


def unit_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` with a unit stride on its last dim (the kernels' one layout requirement)."""
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def _as_table(name: str, t: torch.Tensor, half: int, b: int, device: torch.device) -> torch.Tensor:
    """A cos/sin table on q's ``device`` as ``[1 or b, n, r/2]``."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor, got {getattr(t, 'dtype', type(t))}"
        )
    check_device(name, t, device, "q")
    if t.dim() == 2:
        t = t.unsqueeze(0)  # [1, n, r/2]
    if t.dim() != 3 or t.shape[-1] != half or t.shape[0] not in (1, b):
        raise ValueError(
            f"{name} must be [n, r/2] or [1 or b={b}, n, r/2] with r/2={half}, got {tuple(t.shape)}"
        )
    return unit_last(t)


def _as_positions(name: str, p: torch.Tensor, b: int, s: int, device: torch.device) -> torch.Tensor:
    """Positions on q's ``device`` as ``[1 or b, s]``."""
    if not isinstance(p, torch.Tensor) or p.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            f"{name} must be an int32/int64 tensor of table rows, got "
            f"{getattr(p, 'dtype', type(p))}; build positions with torch.arange(..., dtype=torch.long)"
        )
    check_device(name, p, device, "q")
    if p.dim() == 1:
        p = p.unsqueeze(0)  # [1, s]
    if p.dim() != 2 or p.shape[1] != s or p.shape[0] not in (1, b):
        raise ValueError(f"{name} must be [s={s}] or [1 or b={b}, s], got {tuple(p.shape)}")
    return unit_last(p)


def _check_rows(name: str, p: torch.Tensor | None, seq: int, table: torch.Tensor) -> None:
    """Every position indexes a row of its table: checked where reading values is free (eager,
    CPU), as an async device assertion on accelerators, skipped under torch.compile."""
    n = table.shape[1]
    if p is None:
        if n != seq:
            raise ValueError(
                f"without {name}, the table rows are the positions 0..{seq - 1}: expected {seq} "
                f"rows, got {n}; pass {name}= to index a longer table"
            )
        return
    check_rows(name, p, n)


def small_range(p: torch.Tensor) -> tuple[int, int]:
    """``(min, max)`` of a small non-empty integer ``p`` (a decode step's ``[s]``, ``[b, s]`` or
    more) read as a list: cheaper than reduction kernels at this size. Only where reading
    values is free (:func:`posenc._checks.host_readable`)."""
    if p.numel() == 1:  # one sequence's decode step: one value
        value = int(p.item())
        return value, value
    if p.dim() > 2:
        flat = p.reshape(-1).tolist()
    else:  # [s] or [b, s] read as they are: a reshape is an op of its own
        values = p.tolist()
        flat = values if p.dim() == 1 else [v for row in values for v in row]
    return min(flat), max(flat)


def check_rows(name: str, p: torch.Tensor, n: int) -> None:
    """Every value of ``p`` (integer ``[s]`` or ``[b, s]``) is in ``[0, n)``: read as a list
    where that is free and ``p`` small (a decode step; cheaper than three reductions), else
    :func:`check_values`' capture-safe branches. (A planned call has the kernel check its
    positions, and comes here only for the message of one that failed.)"""
    numel = p.numel()
    if not numel:
        return
    if numel <= 64 and host_readable(p):
        low, high = small_range(p)
        if low < 0 or high >= n:
            raise ValueError(
                f"{name} must index the table's {n} rows, got values in [{low}, {high}]"
            )
        return
    check_values(
        (p >= 0) & (p < n),
        lambda: (
            f"{name} must index the table's {n} rows, got values in "
            f"[{int(p.min())}, {int(p.max())}]"
        ),
    )


def _meta(t: torch.Tensor) -> tuple:
    """What the checks of a tensor read: its type, shape, strides, dtype, whether it is on the
    CPU and whether it requires grad (the backend choice reads that). No value. (``is_cpu``,
    not the device: plans are made for CPU calls alone, and there is one CPU device.)"""
    return (type(t), t.shape, t.stride(), t.dtype, t.is_cpu, t.requires_grad)


def call_key(given: Given, *options: object) -> tuple | None:
    """Everything :func:`canonicalize`'s shape checks and the backend choice read about a CPU
    call ``given`` (:data:`Given`), as a dict key (None when an argument is not a tensor: the
    checks will say so). Two calls with one key pass or fail those checks alike; only the
    positions' values differ.

    ``options``: the call's other arguments (rotary_dim, layouts, backend, ...). Grad mode and
    the thread count are added (the backend choice and the CPU kernel's arguments read them).
    Runs on every decode step: one flat tuple, q's to sin's fields written out.
    """
    q, k, cos, sin, cos_k, sin_k, positions, k_positions = given
    try:
        return (
            type(q), q.shape, q.stride(), q.dtype, q.is_cpu, q.requires_grad,
            type(k), k.shape, k.stride(), k.dtype, k.is_cpu, k.requires_grad,
            type(cos), cos.shape, cos.stride(), cos.dtype, cos.is_cpu, cos.requires_grad,
            type(sin), sin.shape, sin.stride(), sin.dtype, sin.is_cpu, sin.requires_grad,
            None if cos_k is None else _meta(cos_k),
            None if sin_k is None else _meta(sin_k),
            None if positions is None else _meta(positions),
            # The same object as positions: k shares q's rows (canonicalize reads the identity).
            None if k_positions is None else True if k_positions is positions else _meta(k_positions),
            options, torch.is_grad_enabled(), torch.get_num_threads(),
        )  # fmt: skip
    except (AttributeError, RuntimeError):  # not a tensor, or one without strides (sparse)
        return None


def qk_key(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    k_positions: torch.Tensor | None,
    *options: object,
) -> tuple | None:
    """:func:`call_key` for a module's ``forward(q, k, positions, k_positions)``: what its
    shape checks read (None when an argument is not a tensor)."""
    try:
        return (
            type(q), q.shape, q.stride(), q.dtype, q.is_cpu, q.requires_grad,
            type(k), k.shape, k.stride(), k.dtype, k.is_cpu, k.requires_grad,
            type(positions), positions.shape, positions.stride(), positions.dtype,
            positions.is_cpu,
            None if k_positions is None else True if k_positions is positions else _meta(k_positions),
            options, torch.is_grad_enabled(), torch.get_num_threads(),
        )  # fmt: skip
    except (AttributeError, RuntimeError):
        return None


def _varlen_positions(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """Position of each packed token inside its own sequence: ``[total]``.

    ``cu_seqlens = [0, 3, 5]`` -> ``[0 1 2 0 1]``.
    """
    idx = torch.arange(total, device=cu_seqlens.device, dtype=cu_seqlens.dtype)  # [total]
    seq = torch.searchsorted(cu_seqlens[1:], idx, right=True)  # [total] sequence of each token
    return idx - cu_seqlens[seq]  # [total]


def _check_qk(q: torch.Tensor, k: torch.Tensor, seq_layout: str) -> None:
    """q and k are floating-point tensors on one device; ``seq_layout`` is known. (Of different
    dtypes they go to the reference: :func:`mixed_backend`.)"""
    for name, x in (("q", q), ("k", k)):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(
                f"{name} must be a floating-point tensor, got {getattr(x, 'dtype', type(x))}"
            )
    if q.device != k.device:
        raise TypeError(f"q and k must be on one device, got {q.device} and {k.device}")
    if seq_layout not in SEQ_LAYOUTS:
        raise ValueError(f"seq_layout must be one of {SEQ_LAYOUTS}, got {seq_layout!r}")


def _check_cu_seqlens(q: torch.Tensor, k: torch.Tensor, cu_seqlens: torch.Tensor) -> None:
    """Packed q and k ``[total, h, d]`` and boundaries that rise from 0 to ``total``."""
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0]:
        raise ValueError(
            "with cu_seqlens, q and k must be packed [total, h, d] with the same total, got "
            f"{tuple(q.shape)} and {tuple(k.shape)}"
        )
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype not in (
        torch.int32,
        torch.int64,
    ):
        got = getattr(cu_seqlens, "dtype", type(cu_seqlens).__name__)
        raise TypeError(f"cu_seqlens must be a 1-D int32/int64 tensor, got {got}")
    if cu_seqlens.dim() != 1:
        raise ValueError(
            f"cu_seqlens must be 1-D [num_seqs + 1], got shape {tuple(cu_seqlens.shape)}"
        )
    check_device("cu_seqlens", cu_seqlens, q.device, "q")
    total = q.shape[0]
    if cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens needs at least 2 entries [0, total], got {cu_seqlens}")
    bounds = torch.tensor([0, total], device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    check_values(
        torch.cat(((cu_seqlens[1:] >= cu_seqlens[:-1]), cu_seqlens[[0, -1]] == bounds)),
        lambda: (
            f"cu_seqlens must rise from 0 to total={total} (one entry per sequence "
            f"boundary), got {cu_seqlens.tolist()}"
        ),
    )


_Views = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]


def _bhsd_views(
    q: torch.Tensor,
    k: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    seq_layout: str,
    positions: torch.Tensor | None,
    k_positions: torch.Tensor | None,
) -> _Views:
    """q ``[b, h, s, d]`` and k ``[b, hk, t, d]`` views of any accepted form, and the positions
    (packed input without positions gets its own): ``(q4, k4, positions, k_positions)``."""
    if cu_seqlens is not None:
        # Packed: one batch row, positions counted from each sequence's start when none are given.
        _check_cu_seqlens(q, k, cu_seqlens)
        q4 = q.unsqueeze(0).transpose(1, 2)  # [total, h, d] -> [1, h, total, d]
        k4 = k.unsqueeze(0).transpose(1, 2)  # [1, hk, total, d]
        if positions is None:
            positions = _varlen_positions(cu_seqlens, q.shape[0])  # [total]
            if k_positions is None:
                k_positions = positions  # the same object: q and k share the table rows
        return q4, k4, positions, k_positions
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(
            f"q and k must be 4-D ({seq_layout}) or packed [total, h, d] with cu_seqlens, got "
            f"{tuple(q.shape)} and {tuple(k.shape)}"
        )
    if seq_layout == "bshd":
        # [b, s, h, d] -> [b, h, s, d] view; k likewise -> [b, hk, t, d]
        return q.transpose(1, 2), k.transpose(1, 2), positions, k_positions
    return q, k, positions, k_positions


_Tables = tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _canonical_tables(
    cos: torch.Tensor,
    sin: torch.Tensor,
    cos_k: torch.Tensor | None,
    sin_k: torch.Tensor | None,
    rotary_dim: int | None,
    b: int,
    d: int,
    device: torch.device,
) -> _Tables:
    """``(r, cos_q, sin_q, cos_k, sin_k)``, each table ``[1 or b, n, r/2]`` on q's ``device``;
    k's are q's (the same objects) without ``cos_k``/``sin_k``."""
    if not isinstance(cos, torch.Tensor) or cos.dim() == 0:
        raise TypeError(f"cos must be a tensor [n, r/2] or [b, n, r/2], got {type(cos).__name__}")
    r = 2 * cos.shape[-1] if rotary_dim is None else rotary_dim
    if isinstance(r, bool) or not isinstance(r, int) or r % 2 or not 0 < r <= d:
        raise ValueError(f"rotary_dim must be an even integer in [2, head_dim={d}], got {r!r}")
    half, dev = r // 2, device
    cos_q3, sin_q3 = _as_table("cos", cos, half, b, dev), _as_table("sin", sin, half, b, dev)
    if (cos_k is None) != (sin_k is None):
        raise ValueError("give both cos_k and sin_k, or neither")
    if cos_k is None or sin_k is None:
        cos_k3, sin_k3 = cos_q3, sin_q3
    else:
        cos_k3 = _as_table("cos_k", cos_k, half, b, dev)
        sin_k3 = _as_table("sin_k", sin_k, half, b, dev)
    if cos_q3.shape != sin_q3.shape or cos_k3.shape != sin_k3.shape:
        raise ValueError(
            f"cos and sin must have one shape, got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    return r, cos_q3, sin_q3, cos_k3, sin_k3


def _canonical_positions(
    positions: torch.Tensor | None,
    k_positions: torch.Tensor | None,
    own_k_table: bool,
    b: int,
    s: int,
    t: int,
    device: torch.device,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(pos_q [1 or b, s], pos_k [1 or b, t])`` on q's ``device``, either None for row i =
    position i; pos_k is pos_q (the same object) where k shares q's table and rows."""
    pos_q = None if positions is None else _as_positions("positions", positions, b, s, device)
    if k_positions is not None:
        # The same object as q's (self-attention) lets the kernels share the loaded table rows.
        same = k_positions is positions and not own_k_table
        pos_k = pos_q if same else _as_positions("k_positions", k_positions, b, t, device)
        return pos_q, pos_k
    if own_k_table:
        return pos_q, None  # k's own table, row i = position i
    if t != s:  # k shares q's table and rows: it must cover the same positions
        raise ValueError(
            f"k has {t} positions and q {s}: pass k_positions (rows of the shared table) or "
            "cos_k/sin_k (k's own table)"
        )
    return pos_q, pos_q


def canonicalize(
    given: Given,
    cu_seqlens: torch.Tensor | None,
    rotary_dim: int | None,
    seq_layout: str,
    interleaved: bool,
) -> RopeArgs:
    """Check every accepted input form of the call ``given`` (:data:`Given`) and return the
    canonical one (module docstring)."""
    q, k, cos, sin, cos_k, sin_k, positions, k_positions = given
    _check_qk(q, k, seq_layout)
    q4, k4, positions, k_positions = _bhsd_views(
        q, k, cu_seqlens, seq_layout, positions, k_positions
    )
    b, _, s, d = q4.shape
    if k4.shape[0] != b or k4.shape[3] != d:
        raise ValueError(
            f"q and k must agree on batch and head_dim, got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    t = k4.shape[2]
    dev = q.device
    r, cos_q3, sin_q3, cos_k3, sin_k3 = _canonical_tables(
        cos, sin, cos_k, sin_k, rotary_dim, b, d, dev
    )
    pos_q, pos_k = _canonical_positions(positions, k_positions, cos_k is not None, b, s, t, dev)
    _check_rows("positions", pos_q, s, cos_q3)
    if pos_k is not pos_q or cos_k3 is not cos_q3:
        _check_rows("k_positions", pos_k, t, cos_k3)
    return RopeArgs(q4, k4, cos_q3, sin_q3, cos_k3, sin_k3, pos_q, pos_k, r, interleaved)


def _may_overlap(x: torch.Tensor) -> bool:
    """Whether two indices of ``x`` may share memory. False is proof: with the dims sorted by
    stride, each stride exceeds the span of the dims inside it (every dense or sliced tensor).
    True is reported for stride-0 dims (``expand``) and for layouts that fail this test."""
    span = 0  # elements spanned by the dims placed so far, minus one
    dims = sorted((st, n) for n, st in zip(x.shape, x.stride(), strict=True) if n > 1)
    for stride, size in dims:
        if stride <= span:
            return True
        span += (size - 1) * stride
    return False


def check_inplace(q: torch.Tensor, k: torch.Tensor) -> None:
    """In place needs memory where each element of q and k is its own: a unit stride on
    head_dim, no overlap inside a tensor (``expand``), and q and k not the same memory. (Slices
    of one packed qkv tensor are fine; partially overlapping q and k are not detected.)"""
    for name, x in (("q", q), ("k", k)):
        if x.shape[-1] > 1 and x.stride(-1) != 1:
            raise ValueError(
                f"inplace=True needs {name} contiguous along head_dim (stride 1), got strides "
                f"{tuple(x.stride())}; call .contiguous() first or use inplace=False"
            )
        if _may_overlap(x):
            raise ValueError(
                f"inplace=True needs {name} without overlapping memory (got strides "
                f"{tuple(x.stride())}, e.g. from expand()); writing in place would rotate shared "
                "elements more than once. Use inplace=False"
            )
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        for name, x in (("q", q), ("k", k)):
            base = x._base if x._base is not None else x
            if x.requires_grad and base.is_leaf:
                what = "a leaf tensor" if base is x else "a view of a leaf tensor"
                raise ValueError(
                    f"inplace=True cannot write into {name}: it is {what} that requires grad, "
                    "which autograd forbids to modify; use inplace=False, or rotate a non-leaf "
                    "(e.g. the projection's output) instead"
                )
    same = q is k or (
        not torch.compiler.is_compiling()  # data pointers are not traceable
        and q.numel() > 0
        and k.numel() > 0
        and q.data_ptr() == k.data_ptr()
    )
    if same:
        raise ValueError(
            "inplace=True needs q and k in separate memory, but they start at one address"
        )
