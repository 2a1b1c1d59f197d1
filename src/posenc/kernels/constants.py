"""The RoPE stack's constants, in one place: the rotary modules, the functional API, the kernels
and the benchmarks all import them from here (a second copy would be a future disagreement).
"""

from __future__ import annotations

import torch

#: Pair layouts. ``half``: (x[i], x[i + r/2]) (GPT-NeoX, LLaMA); ``interleaved``: (x[2i], x[2i+1])
#: (GPT-J, GLM, DeepSeek's complex form).
ROTARY_LAYOUTS: tuple[str, ...] = ("half", "interleaved")
#: Implementations of the rotation: ``auto`` picks the fastest that applies (triton on GPU
#: tensors, the native kernel on CPU tensors), ``torch`` is the pure-PyTorch reference.
ROTARY_BACKENDS: tuple[str, ...] = ("auto", "torch", "triton", "cpu")
#: Tensor layouts the fused entry :func:`posenc.kernels.rope_qk` takes besides packed varlen.
SEQ_LAYOUTS: tuple[str, ...] = ("bhsd", "bshd")
#: dtypes for frequencies and angles: float32 reproduces transformers, float64 stays exact.
ANGLE_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float64)
#: Storage dtypes each fused kernel takes (the math is float32 in both).
TRITON_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
CPU_KERNEL_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
