"""The native CPU rotary kernel (``csrc/rope_cpu.c``): build at first use, load, launch.

The C source has no torch headers, so it compiles in about a second with the system C compiler
(``$CC``, else ``cc``/``gcc``/``clang``) into ``$POSENC_CACHE_DIR`` (default
``~/.cache/posenc``), keyed by a hash of the source, the flags and the CPU's feature flags
(``-march=native`` code must not run on another CPU). It links OpenMP by soname, so inside a
torch process it shares torch's OpenMP runtime and thread count. When no compiler works, or
``POSENC_DISABLE_CPU_KERNEL=1``, :func:`cpu_kernel_status` says why and the dispatcher uses the
pure-PyTorch path.

Shapes: ``b`` batch, ``h`` heads, ``s`` sequence length, ``d`` head_dim, ``r`` rotary_dim.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import struct
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from .canonical import check_kernel_tensor
from .constants import CPU_KERNEL_DTYPES
from .reference import RopeArgs

SOURCE = Path(__file__).parent / "csrc" / "rope_cpu.c"

# Tried in order; the first that compiles wins (the later ones for compilers without
# -march=native or OpenMP: slower, still correct).
_FLAG_SETS = (
    ("-O3", "-march=native", "-fopenmp"),
    ("-O3", "-fopenmp"),
    ("-O3", "-march=native"),
    ("-O3",),
)
# No FMA contraction: x*c - y*s is then rounded as PyTorch's eager ops and transformers round it
# (two products, one difference), so float32 results are bit-identical to theirs. An FMA would
# save one instruction per element in a loop bound by memory anyway.
_COMMON_FLAGS = ("-std=gnu11", "-ffp-contract=off", "-shared", "-fPIC")


class _Args(ctypes.Structure):
    """Mirror of ``posenc_rope_args`` in ``csrc/rope_cpu.c`` (checked against its size)."""

    _fields_ = [
        ("x", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("cos", ctypes.c_void_p),
        ("sin", ctypes.c_void_p),
        ("pos", ctypes.c_void_p),
        *[
            (name, ctypes.c_int64)
            for name in (
                "B", "H", "S", "xsb", "xsh", "xss", "osb", "osh", "oss",
                "csb", "css", "ssb", "sss", "psb", "half", "tail", "interleaved", "conj",
                "nthreads",
            )
        ],
    ]  # fmt: skip


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_status: str | None = None  # None: not tried yet; "" loaded; otherwise why not


def _cache_dir() -> Path:
    root = os.environ.get("POSENC_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "posenc"


def _cpu_fingerprint() -> str:
    """What ``-march=native`` depends on: the machine and its CPU feature flags."""
    parts = [platform.machine(), platform.processor()]
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features", "model name")):
                    parts.append(line.strip())
                    if len(parts) > 4:
                        break
    except OSError:
        pass
    return "\n".join(parts)


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _build() -> tuple[ctypes.CDLL | None, str]:
    if os.environ.get("POSENC_DISABLE_CPU_KERNEL", "") not in ("", "0"):
        return None, "disabled by POSENC_DISABLE_CPU_KERNEL"
    cc = _compiler()
    if cc is None:
        return None, "no C compiler found (set CC, or install gcc/clang)"
    source = SOURCE.read_bytes()
    out_dir = _cache_dir() / "kernels"
    errors = []
    for flags in _FLAG_SETS:
        parts = [source, cc.encode(), " ".join(flags + _COMMON_FLAGS).encode()]
        key = hashlib.sha256(b"\0".join([*parts, _cpu_fingerprint().encode()])).hexdigest()[:16]
        path = out_dir / f"rope_cpu_{key}.so"
        if not path.exists():
            try:
                out_dir.mkdir(parents=True, exist_ok=True)
                # Build under a unique name and rename: concurrent processes (pytest -n) may
                # build at once, and a half-written .so must never be loaded.
                fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
                os.close(fd)
                cmd = [cc, *flags, *_COMMON_FLAGS, str(SOURCE), "-o", tmp]
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
                if res.returncode != 0:
                    os.unlink(tmp)
                    errors.append(f"{' '.join(cmd)}: {res.stderr.strip()[-300:]}")
                    continue
                os.replace(tmp, path)
            except (OSError, subprocess.SubprocessError) as e:
                errors.append(f"{cc} {' '.join(flags)}: {e}")
                continue
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            errors.append(f"loading {path}: {e}")
            continue
        lib.posenc_rope_args_size.restype = ctypes.c_int64
        if lib.posenc_rope_args_size() != ctypes.sizeof(_Args):
            return None, f"{path}: argument struct size mismatch (stale cache? delete it)"
        for fn in (lib.posenc_rope_f32, lib.posenc_rope_bf16):
            fn.argtypes = [ctypes.POINTER(_Args)]
            fn.restype = ctypes.c_int
        if _PAIR.size != 2 * ctypes.sizeof(_Args):
            return None, f"packed argument size {_PAIR.size} != 2 x {ctypes.sizeof(_Args)}"
        lib.posenc_rope_qk.argtypes = [ctypes.c_char_p, ctypes.c_int64]
        lib.posenc_rope_qk.restype = ctypes.c_int
        return lib, ""
    return None, "could not build the CPU rotary kernel: " + " | ".join(errors)


def cpu_kernel_status() -> str:
    """``""`` when the native kernel is loaded (building it on the first call), else why not."""
    global _lib, _status
    if _status is None:
        with _lock:
            if _status is None:
                _lib, _status = _build()
    return _status


def rope_cpu(
    x: torch.Tensor,
    out: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor | None,
    rotary_dim: int,
    interleaved: bool,
    conj: bool,
) -> None:
    """Write the rotation of ``x`` into ``out`` (``out`` may be ``x``: in place).

    Shapes: ``x``, ``out [b, h, s, d]`` (strides free but a unit stride on ``d``); ``cos``,
    ``sin [bt, n, r/2]`` float32, ``bt`` 1 or ``b``; ``positions [bp, s]`` int64 (``bp`` 1 or
    ``b``) with values in ``[0, n)``, or None for row ``i`` = position ``i`` (then ``n >= s``).
    """
    status = cpu_kernel_status()
    if status:
        raise RuntimeError(f"the CPU rotary kernel is unavailable: {status}")
    assert _lib is not None
    for name, t in (("x", x), ("out", out)):
        check_kernel_tensor(name, t, "CPU kernel", "cpu", CPU_KERNEL_DTYPES)
    if out.shape != x.shape or out.dtype != x.dtype:
        raise ValueError(f"out must match x, got {tuple(out.shape)} {out.dtype} for {x.dtype}")
    b, _, s, d = x.shape
    if rotary_dim % 2 or not 0 < rotary_dim <= d:
        raise ValueError(f"rotary_dim must be even and in [2, {d}], got {rotary_dim}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dtype != torch.float32 or t.dim() != 3 or t.shape[-1] != rotary_dim // 2:
            raise ValueError(
                f"{name} must be float32 [1 or b, n, r/2={rotary_dim // 2}], got "
                f"{t.dtype} {tuple(t.shape)}"
            )
        if t.shape[0] not in (1, b) or t.stride(-1) != 1 or t.device.type != "cpu":
            raise ValueError(f"{name} must be a CPU table with batch 1 or {b} and unit last stride")
    if positions is not None:
        if positions.dtype != torch.int64 or positions.dim() != 2 or positions.shape[1] != s:
            raise ValueError(f"positions must be int64 [1 or b, s={s}], got {positions.dtype}")
        if positions.shape[0] not in (1, b) or positions.stride(-1) != 1:
            raise ValueError("positions must have batch 1 or b and a unit last stride")
    elif cos.shape[1] < s or sin.shape[1] < s:
        raise ValueError(f"without positions the tables need >= s={s} rows, got {cos.shape[1]}")
    if x.numel() == 0:
        return
    a = RopeArgs(x, x, cos, sin, cos, sin, positions, positions, rotary_dim, interleaved)
    args = _Args(*_fields(a, 0, out, conj))
    fn = _lib.posenc_rope_bf16 if x.dtype == torch.bfloat16 else _lib.posenc_rope_f32
    if fn(ctypes.byref(args)) != 0:
        raise MemoryError("the CPU rotary kernel could not allocate its table scratch")


def _fields(a: RopeArgs, side: int, out: torch.Tensor, conj: bool) -> tuple[int, ...]:
    """The values of ``posenc_rope_args`` for q (``side`` 0) or k (1), in its field order. A
    shared (batch-1) table or position row is read with batch stride 0."""
    if side:
        x, cos, sin, positions = a.k, a.cos_k, a.sin_k, a.positions_k
    else:
        x, cos, sin, positions = a.q, a.cos_q, a.sin_q, a.positions_q
    rotary_dim, interleaved = a.rotary_dim, a.interleaved
    b, h, s, d = x.shape
    xs, os_, cs, ss = x.stride(), out.stride(), cos.stride(), sin.stride()
    pos, psb = 0, 0
    if positions is not None:
        pos, psb = positions.data_ptr(), positions.stride(0) if positions.shape[0] > 1 else 0
    return (
        x.data_ptr(), out.data_ptr(), cos.data_ptr(), sin.data_ptr(), pos,
        b, h, s, xs[0], xs[1], xs[2], os_[0], os_[1], os_[2],
        cs[0] if cos.shape[0] > 1 else 0, cs[1], ss[0] if sin.shape[0] > 1 else 0, ss[1], psb,
        rotary_dim // 2, d - rotary_dim, int(interleaved), int(conj), torch.get_num_threads(),
    )  # fmt: skip


# Two posenc_rope_args back to back (5 pointers, 19 int64 each, no padding), packed in one
# call: at decode shapes building ctypes structures field by field costs more than the kernel.
_PAIR = struct.Struct("=5Q19q5Q19q")


# The five pointers that open one posenc_rope_args, and the 19 integers after them.
_POINTERS = struct.Struct("=5Q")
_FIXED = struct.Struct("=19q")


class CpuCall:
    """A prepared foreign call for one layout of canonical q, k, tables and positions: every
    integer of both argument structs (shapes, strides, flags, threads) packed once, so a call
    packs only the ten pointers. Valid for any tensors of the shapes and strides it was made
    from (:func:`prepare_cpu_qk`); the caller keys it by them."""

    __slots__ = ("_bf16", "_fixed_k", "_fixed_q", "_fn")

    def __init__(self, fixed_q: bytes, fixed_k: bytes, bf16: bool, fn: object) -> None:
        self._fixed_q, self._fixed_k, self._bf16, self._fn = fixed_q, fixed_k, int(bf16), fn

    def __reduce__(self) -> tuple:
        # The foreign function is not picklable: a copy (deepcopy, pickle) looks it up again.
        return (_cpu_call, (self._fixed_q, self._fixed_k, bool(self._bf16)))

    def __call__(
        self,
        q: torch.Tensor,
        q_out: torch.Tensor,
        cos_q: int,
        sin_q: int,
        pos_q: int,
        k: torch.Tensor,
        k_out: torch.Tensor,
        cos_k: int,
        sin_k: int,
        pos_k: int,
    ) -> None:
        """Rotate ``q``, ``k`` into ``q_out``, ``k_out``; the tables and positions by their data
        pointers (0: no positions). Views of the canonical tensors it was prepared for work
        alike: a transposed ``[b, s, h, d]`` tensor or an unsqueezed table starts at the same
        address."""
        args = (
            _POINTERS.pack(q.data_ptr(), q_out.data_ptr(), cos_q, sin_q, pos_q) + self._fixed_q
            + _POINTERS.pack(k.data_ptr(), k_out.data_ptr(), cos_k, sin_k, pos_k) + self._fixed_k
        )  # fmt: skip
        if self._fn(args, self._bf16) != 0:  # type: ignore[operator]
            raise MemoryError("the CPU rotary kernel could not allocate its table scratch")


def _cpu_call(fixed_q: bytes, fixed_k: bytes, bf16: bool) -> CpuCall:
    status = cpu_kernel_status()
    if status:
        raise RuntimeError(f"the CPU rotary kernel is unavailable: {status}")
    assert _lib is not None
    return CpuCall(fixed_q, fixed_k, bf16, _lib.posenc_rope_qk)


def prepare_cpu_qk(a: RopeArgs, q_out: torch.Tensor, k_out: torch.Tensor) -> CpuCall:
    """The :class:`CpuCall` of :func:`rope_cpu_qk` for inputs of ``a``'s shapes and strides
    (int64 positions with a unit last stride, or None), forward rotation (``conj=False``)."""
    fixed_q = _FIXED.pack(*_fields(a, 0, q_out, False)[5:])
    fixed_k = _FIXED.pack(*_fields(a, 1, k_out, False)[5:])
    return _cpu_call(fixed_q, fixed_k, a.q.dtype == torch.bfloat16)


def rope_cpu_qk(a: RopeArgs, q_out: torch.Tensor, k_out: torch.Tensor, conj: bool) -> None:
    """q and k in one foreign call, on inputs the dispatcher has already checked.

    The forms of :func:`rope_cpu` for each of ``(q, q_out, cos_q, sin_q, positions_q)`` and
    ``(k, k_out, cos_k, sin_k, positions_k)`` (int64 positions). Not checked again here:
    :func:`posenc.kernels.rope_op.rope_qk` checks once, and at decode shapes a second pass of
    checks would cost more than the rotation.
    """
    status = cpu_kernel_status()
    if status:
        raise RuntimeError(f"the CPU rotary kernel is unavailable: {status}")
    assert _lib is not None
    args = _PAIR.pack(*_fields(a, 0, q_out, conj), *_fields(a, 1, k_out, conj))
    if _lib.posenc_rope_qk(args, int(a.q.dtype == torch.bfloat16)) != 0:
        raise MemoryError("the CPU rotary kernel could not allocate its table scratch")
