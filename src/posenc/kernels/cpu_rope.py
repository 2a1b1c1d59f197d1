"""The native CPU rotary kernel (``csrc/rope_cpu.c``): build at first use, load, launch.

The C source has no torch headers. It is compiled once per instruction-set variant with the
system C compiler (``$CC``, else ``cc``/``gcc``/``clang``) into ``$POSENC_CACHE_DIR/kernels``
(default ``~/.cache/posenc/kernels``), keyed by a hash of the source, the compiler and the flags.
The first build takes about 2-4 s of compiler CPU time (15 s of wall time was seen on a loaded
2-core machine); later processes load the cached library in milliseconds. Each build is logged
on the ``posenc.kernels`` logger (INFO), and ``posenc kernels`` shows the status or builds now.

Variants (:data:`ISA_VARIANTS`) are compiled with explicit flags, never ``-march=native``, and
chosen at load from what the CPU has (``/proc/cpuinfo``'s flags, else torch's
``get_cpu_capability()``): ``avx512bf16``, ``avx512``, ``avx2``, then ``generic`` (portable C,
every CPU and architecture). ``POSENC_CPU_ISA=<variant>`` forces one (``auto``: the default).
The library links OpenMP by soname, so inside a torch process it shares torch's OpenMP runtime
and thread count. When no compiler works, or ``POSENC_DISABLE_CPU_KERNEL=1``,
:func:`cpu_kernel_status` says why and the dispatcher uses the pure-PyTorch path.

Shapes: ``b`` batch, ``h`` heads, ``s`` sequence length, ``d`` head_dim, ``r`` rotary_dim.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import logging
import os
import platform
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import torch

from .canonical import check_kernel_tensor
from .constants import CPU_KERNEL_DTYPES
from .reference import RopeArgs

SOURCE = Path(__file__).parent / "csrc" / "rope_cpu.c"
log = logging.getLogger("posenc.kernels")

#: Instruction-set variants of the kernel, best first: the compiler flags of each build and the
#: CPU features (``/proc/cpuinfo`` flag names) it needs. ``generic`` needs nothing.
ISA_VARIANTS: dict[str, tuple[tuple[str, ...], frozenset[str]]] = {
    "avx512bf16": (
        ("-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16"),
        frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16"}),
    ),
    "avx512": (
        ("-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl"),
        frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512vl"}),
    ),
    "avx2": (("-mavx2", "-mfma"), frozenset({"avx2", "fma"})),
    "generic": ((), frozenset()),
}
# torch.backends.cpu.get_cpu_capability() -> the features it implies (where /proc/cpuinfo is not
# there to read: macOS, Windows).
_TORCH_CAPABILITY = {
    "AVX512": ISA_VARIANTS["avx512"][1],
    "AVX512_BF16": ISA_VARIANTS["avx512bf16"][1],
    "AVX2": ISA_VARIANTS["avx2"][1],
}
# Per variant, tried in order; the first that compiles wins (the later one for compilers without
# OpenMP: one thread, still correct).
_FLAG_SETS = (("-O3", "-fopenmp"), ("-O3",))
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
                "nthreads", "rows",
            )
        ],
    ]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class KernelInfo:
    """The CPU kernel of this process, as ``posenc kernels`` shows it (nothing is built to
    answer): the variant chosen and why, the compiler, the cached library and its state."""

    isa: str  # the variant chosen (or to be chosen at first use)
    why: str  # why that variant
    compiler: str | None  # None: no C compiler found
    path: Path | None  # the variant's library in the cache (None without a compiler)
    built: bool  # the library is in the cache
    loaded: bool  # loaded in this process
    build_seconds: float | None  # wall time of the build, when this process built it
    status: str  # cpu_kernel_status() once tried: "" loaded, else why not; "not tried yet"


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_status: str | None = None  # None: not tried yet; "" loaded; otherwise why not
_loaded: KernelInfo | None = None  # what the last load found or built


def _cache_dir() -> Path:
    root = os.environ.get("POSENC_CACHE_DIR")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "posenc"


def cpu_features() -> frozenset[str]:
    """The CPU's x86 feature flags by ``/proc/cpuinfo``'s names (``avx2``, ``avx512_bf16``, ...),
    from that file where there is one, else from torch's CPU capability; empty off x86-64."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return frozenset()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return _TORCH_CAPABILITY.get(torch.backends.cpu.get_cpu_capability(), frozenset())


def choose_isa(asked: str | None = None) -> tuple[list[str], str]:
    """The variants to try, best first, and why: ``asked`` (default ``$POSENC_CPU_ISA``) alone
    when it names one, else every variant this CPU can run. ValueError for an unknown name or
    one this CPU cannot run (its code would stop at the first instruction it lacks)."""
    have = cpu_features()
    runs = [n for n, (_, need) in ISA_VARIANTS.items() if need <= have]
    name = (os.environ.get("POSENC_CPU_ISA", "") if asked is None else asked).strip().lower()
    if name in ("", "auto"):
        known = frozenset().union(*(need for _, need in ISA_VARIANTS.values()))
        lacks = sorted(known - have)
        why = f"the best this CPU runs (it lacks {', '.join(lacks)})" if lacks else "the best"
        return runs, why
    if name not in ISA_VARIANTS:
        raise ValueError(
            f"POSENC_CPU_ISA must be auto or one of {', '.join(ISA_VARIANTS)}, got {name!r}"
        )
    if name not in runs:
        missing = ", ".join(sorted(ISA_VARIANTS[name][1] - have))
        raise ValueError(
            f"POSENC_CPU_ISA={name} needs CPU features this CPU lacks ({missing}); it runs: "
            f"{', '.join(runs)}"
        )
    return [name], f"POSENC_CPU_ISA={name}"


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _library(cc: str, flags: tuple[str, ...], isa: str) -> Path:
    """Where the build of ``isa`` with these flags lives in the cache."""
    parts = [SOURCE.read_bytes(), cc.encode(), " ".join(flags + _COMMON_FLAGS).encode()]
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    return _cache_dir() / "kernels" / f"rope_cpu_{isa}_{key}.so"


def _compile(cc: str, flags: tuple[str, ...], path: Path) -> str:
    """Build the library at ``path``: "" when it did, else the compiler's complaint."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Build under a unique name and rename: concurrent processes (pytest -n) may build at
        # once, and a half-written .so must never be loaded.
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
        os.close(fd)
        cmd = [cc, *flags, *_COMMON_FLAGS, str(SOURCE), "-o", tmp]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if res.returncode != 0:
            os.unlink(tmp)
            return f"{' '.join(cmd)}: {res.stderr.strip()[-300:]}"
        os.replace(tmp, path)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{cc} {' '.join(flags)}: {e}"
    return ""


def _open(path: Path, isa: str) -> tuple[ctypes.CDLL | None, str]:
    """Load a built library and declare its functions; None and why when it does not fit."""
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        return None, f"loading {path}: {e}"
    lib.posenc_rope_isa.restype = ctypes.c_char_p
    if lib.posenc_rope_isa().decode() != isa:
        return None, f"{path} holds the {lib.posenc_rope_isa().decode()} variant, not {isa}"
    lib.posenc_rope_args_size.restype = ctypes.c_int64
    if lib.posenc_rope_args_size() != ctypes.sizeof(_Args):
        return None, f"{path}: argument struct size mismatch (stale cache? delete it)"
    for fn in (lib.posenc_rope_f32, lib.posenc_rope_bf16):
        fn.argtypes = [ctypes.POINTER(_Args)]
        fn.restype = ctypes.c_int
    if _PAIR.size != 2 * ctypes.sizeof(_Args):
        return None, f"packed argument size {_PAIR.size} != 2 x {ctypes.sizeof(_Args)}"
    lib.posenc_rope_qk.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.posenc_rope_qk.restype = ctypes.c_int
    # No argtypes: the decode path's call (CpuCall) passes bytes (char *) and a Python int (C
    # int) as they are, which ctypes converts faster than through declared types.
    lib.posenc_rope_qk_parts.restype = ctypes.c_int
    return lib, ""


def _build_isa(cc: str, isa: str, why: str) -> tuple[ctypes.CDLL | None, str, KernelInfo]:
    """Load ``isa``'s library from the cache, building it first when it is not there."""
    errors = []
    for base in _FLAG_SETS:
        flags = (*base, *ISA_VARIANTS[isa][0])
        path = _library(cc, flags, isa)
        seconds = None
        if not path.exists():
            log.info("building the CPU rotary kernel (%s) with %s into %s", isa, cc, path.parent)
            start = time.perf_counter()
            err = _compile(cc, flags, path)
            if err:
                errors.append(err)
                continue
            seconds = time.perf_counter() - start
            log.info("built the CPU rotary kernel (%s) in %.1f s: %s", isa, seconds, path.name)
        lib, err = _open(path, isa)
        if lib is None:
            errors.append(err)
            continue
        return lib, "", KernelInfo(isa, why, cc, path, True, True, seconds, "")
    return None, " | ".join(errors), KernelInfo(isa, why, cc, path, False, False, None, "")


def disabled() -> bool:
    """``POSENC_DISABLE_CPU_KERNEL`` is set (to anything but 0)."""
    return os.environ.get("POSENC_DISABLE_CPU_KERNEL", "") not in ("", "0")


def _build(asked: str | None = None) -> tuple[ctypes.CDLL | None, str, KernelInfo | None]:
    """Load the best variant that builds (ValueError for a bad ``POSENC_CPU_ISA``)."""
    if disabled():
        return None, "disabled by POSENC_DISABLE_CPU_KERNEL", None
    cc = _compiler()
    if cc is None:
        return None, "no C compiler found (set CC, or install gcc/clang)", None
    candidates, why = choose_isa(asked)
    errors = []
    for isa in candidates:
        lib, err, info = _build_isa(cc, isa, why)
        if lib is not None:
            return lib, "", info
        errors.append(err)
        why = f"{isa} did not build"  # the next one down is chosen for this reason
    return None, "could not build the CPU rotary kernel: " + " | ".join(errors), None


def cpu_kernel_status() -> str:
    """``""`` when the native kernel is loaded (building it on the first call), else why not.
    ValueError when ``POSENC_CPU_ISA`` names no variant this CPU runs."""
    global _lib, _status, _loaded
    if _status is None:
        with _lock:
            if _status is None:
                _lib, _status, _loaded = _build()
    return _status


def load_cpu_kernel(isa: str | None = None) -> str:
    """(Re)load the kernel now, as variant ``isa`` (default: ``$POSENC_CPU_ISA``, else the best
    this CPU runs), building it if it is not cached; returns :func:`cpu_kernel_status`."""
    global _lib, _status, _loaded
    with _lock:
        _lib, _status, _loaded = _build(isa)
    return _status


def cpu_kernel_info() -> KernelInfo:
    """What :func:`cpu_kernel_status` loaded, or would load at first use (nothing is built)."""
    if _loaded is not None and _status is not None:
        return dataclasses.replace(_loaded, status=_status)
    cc = _compiler()
    status = _status if _status is not None else "not tried yet"
    try:
        candidates, why = choose_isa()
    except ValueError as e:
        return KernelInfo("-", str(e), cc, None, False, False, None, str(e))
    isa = candidates[0]
    if cc is None:
        return KernelInfo(isa, why, None, None, False, False, None, status)
    paths = [_library(cc, (*base, *ISA_VARIANTS[isa][0]), isa) for base in _FLAG_SETS]
    path = next((p for p in paths if p.exists()), paths[0])
    return KernelInfo(isa, why, cc, path, path.exists(), False, None, status)


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


def _fields(
    a: RopeArgs, side: int, out: torch.Tensor, conj: bool, rows: int = 0
) -> tuple[int, ...]:
    """The values of ``posenc_rope_args`` for q (``side`` 0) or k (1), in its field order. A
    shared (batch-1) table or position row is read with batch stride 0. ``rows`` > 0: the
    kernel checks the positions index that many table rows (0: the caller checked them)."""
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
        rows,
    )  # fmt: skip


# Two posenc_rope_args back to back (5 pointers, 20 int64 each, no padding), packed in one
# call: at decode shapes building ctypes structures field by field costs more than the kernel.
_PAIR = struct.Struct("=5Q20q5Q20q")


# The 20 integers after the five pointers that open one posenc_rope_args; the ten pointers of
# q's and k's structs, as posenc_rope_qk_parts reads them.
_FIXED = struct.Struct("=20q")
#: What the kernel returns for a position outside its table (``POSENC_OUTSIDE_TABLE``).
OUTSIDE_TABLE = 2
_POINTERS_QK = struct.Struct("=10Q")


class CpuCall:
    """A prepared foreign call for one layout of canonical q, k, tables and positions: every
    integer of both argument structs (shapes, strides, flags, threads) packed once, so a call
    packs only the ten pointers. Valid for any tensors of the shapes and strides it was made
    from (:func:`prepare_cpu_qk`); the caller keys it by them."""

    __slots__ = ("_bf16", "_fixed", "_fixed_k", "_fixed_q", "_fn")

    def __init__(self, fixed_q: bytes, fixed_k: bytes, bf16: bool, fn: object) -> None:
        self._fixed_q, self._fixed_k, self._bf16, self._fn = fixed_q, fixed_k, int(bf16), fn
        self._fixed = fixed_q + fixed_k  # posenc_rope_qk_parts' integer fields, q's then k's

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
    ) -> bool:
        """Rotate ``q``, ``k`` into ``q_out``, ``k_out``; the tables and positions by their data
        pointers (0: no positions). Views of the canonical tensors it was prepared for work
        alike: a transposed ``[b, s, h, d]`` tensor or an unsqueezed table starts at the same
        address. False where a position lies outside the rows it was prepared to check
        (nothing was written)."""
        pointers = _POINTERS_QK.pack(
            q.data_ptr(), q_out.data_ptr(), cos_q, sin_q, pos_q,
            k.data_ptr(), k_out.data_ptr(), cos_k, sin_k, pos_k,
        )  # fmt: skip
        status = self._fn(pointers, self._fixed, self._bf16)  # type: ignore[operator]
        if status == 0:
            return True
        if status == OUTSIDE_TABLE:
            return False
        raise MemoryError("the CPU rotary kernel could not allocate its table scratch")


def _cpu_call(fixed_q: bytes, fixed_k: bytes, bf16: bool) -> CpuCall:
    if len(fixed_q) != _FIXED.size or len(fixed_k) != _FIXED.size:
        raise ValueError(
            f"a CPU kernel call of {len(fixed_q)}-byte fields, prepared by another version of "
            f"posenc: this one's are {_FIXED.size} bytes"
        )
    status = cpu_kernel_status()
    if status:
        raise RuntimeError(f"the CPU rotary kernel is unavailable: {status}")
    assert _lib is not None
    return CpuCall(fixed_q, fixed_k, bf16, _lib.posenc_rope_qk_parts)


def prepare_cpu_qk(
    a: RopeArgs, q_out: torch.Tensor, k_out: torch.Tensor, rows: tuple[int, int] = (0, 0)
) -> CpuCall:
    """The :class:`CpuCall` of :func:`rope_cpu_qk` for inputs of ``a``'s shapes and strides
    (int64 positions with a unit last stride, or None), forward rotation (``conj=False``).
    ``rows``: q's and k's table rows their positions must index, checked by the kernel before
    it writes (0: not checked)."""
    fixed_q = _FIXED.pack(*_fields(a, 0, q_out, False, rows[0])[5:])
    fixed_k = _FIXED.pack(*_fields(a, 1, k_out, False, rows[1])[5:])
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
