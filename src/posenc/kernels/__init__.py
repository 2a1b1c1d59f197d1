"""Fused kernels, each beside the pure-PyTorch reference it is tested against.

Rotary embedding (RoPE) of queries and keys in one pass:

* :func:`rope_qk`: the entry point, with ``backend="auto"|"triton"|"cpu"|"torch"``.
* :mod:`.triton_rope`: the Triton kernel (GPU; CPU under ``TRITON_INTERPRET=1``). Imported
  lazily: posenc never needs triton to import.
* :mod:`.cpu_rope`: the native CPU kernel (``csrc/rope_cpu.c``, built at first use).
* :mod:`.reference`: the pure-PyTorch reference (``backend="torch"``).
"""

from .constants import (
    ANGLE_DTYPES,
    CPU_KERNEL_DTYPES,
    ROTARY_BACKENDS,
    ROTARY_LAYOUTS,
    SEQ_LAYOUTS,
    TRITON_DTYPES,
)
from .reference import (
    apply_rotary_reference,
    gather_rows,
    rope_qk_reference,
    rotate_half,
    rotate_interleaved,
)
from .rope_op import available_backends, rope_qk, rope_qk_canonical, select_backend

__all__ = [
    "ANGLE_DTYPES",
    "CPU_KERNEL_DTYPES",
    "ROTARY_BACKENDS",
    "ROTARY_LAYOUTS",
    "SEQ_LAYOUTS",
    "TRITON_DTYPES",
    "apply_rotary_reference",
    "available_backends",
    "gather_rows",
    "rope_qk",
    "rope_qk_canonical",
    "rope_qk_reference",
    "rotate_half",
    "rotate_interleaved",
    "select_backend",
]
