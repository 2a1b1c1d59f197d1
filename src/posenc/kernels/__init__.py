"""Fused kernels, each beside the pure-PyTorch reference it is tested against.

Rotary embedding (RoPE) of queries and keys in one pass:

* :func:`rope_qk`: the entry point, with ``backend="auto"|"triton"|"cpu"|"torch"``.
* :mod:`.triton_rope`: the Triton kernel (GPU; CPU under ``TRITON_INTERPRET=1``). Imported
  lazily: posenc never needs triton to import.
* :mod:`.cpu_rope`: the native CPU kernel (``csrc/rope_cpu.c``, built at first use).
* :mod:`.reference`: the pure-PyTorch reference (``backend="torch"``).
"""

from .reference import (
    ROPE_LAYOUTS,
    apply_rotary_reference,
    rope_qk_reference,
    rotate_half,
    rotate_interleaved,
)
from .rope_op import ROPE_BACKENDS, SEQ_LAYOUTS, available_backends, rope_qk, select_backend

__all__ = [
    "ROPE_BACKENDS",
    "ROPE_LAYOUTS",
    "SEQ_LAYOUTS",
    "apply_rotary_reference",
    "available_backends",
    "rope_qk",
    "rope_qk_reference",
    "rotate_half",
    "rotate_interleaved",
    "select_backend",
]
