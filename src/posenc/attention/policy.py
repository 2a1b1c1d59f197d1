"""The path policy: which execution path a call takes, from shapes, flags and the device only.

A pure function of its arguments (no module state, no tensor value read): the same call always
takes the same path, and a test can ask for any case without building a layer.
"""

from __future__ import annotations

import functools
import os
import shutil

import torch

ATTENTION_BACKENDS = ("auto", "sdpa", "flex", "explicit")
# "auto" takes FlexAttention for a bias family from this many scores (s * t) up. Measured on CPU
# (2 threads, h = 8, d = 64, inference): the compiled ALiBi kernel is 4.6x faster than SDPA with
# a materialized bias at s = 512 and 11x at s = 2048; whole Attention layers at s = 2048 are
# 3.6x (Sandwich, default positions) to 5.8x (ALiBi) faster. But each new (s, t) costs a kernel compile (seconds),
# so short and decode-sized calls stay on SDPA.
FLEX_MIN_SCORES = 1024 * 1024


@functools.cache
def flex_available(device_type: str) -> bool:
    """Whether compiled FlexAttention can run on this device type in this PyTorch.

    CUDA: when ``torch.nn.attention.flex_attention`` exists. CPU: from torch 2.6 (2.5's inductor
    lowers FlexAttention for CUDA only), with a C++ compiler (inductor builds the kernel).
    Cached: neither changes within a process.
    """
    try:
        import torch.nn.attention.flex_attention
    except ImportError:
        return False
    if device_type == "cuda":
        return torch.cuda.is_available()
    if device_type == "cpu":
        if torch.torch_version.TorchVersion(torch.__version__) < "2.6":
            return False
        return any(
            shutil.which(c) for c in (os.environ.get("CXX", ""), "g++", "c++", "clang++") if c
        )
    return False


def choose_backend(
    backend: str,
    kind: str,
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    dropout_on: bool = False,
    needs_grad: bool = False,
    index_layout: bool = True,
    flex_any_positions: bool = True,
) -> str:
    """The path of one call: ``"sdpa"``, ``"flex"`` or ``"explicit"`` (:mod:`posenc.attention`).

    ``backend``: the layer's ``ATTENTION_BACKENDS`` choice; ``kind``: its encoding's family
    (``"relative"`` runs explicit only, ``"bias"`` may take FlexAttention). Shapes:
    ``q [b, h, s, d]``, ``k [b, hk, t, d]``. ``dropout_on``: attention dropout is active;
    ``needs_grad``: a gradient will flow (FlexAttention has no CPU backward);
    ``index_layout``: the call's keys sit at their indices; ``flex_any_positions``: the
    encoding's ``score_mod`` is cheap for any positions (else only in the index layout).
    Raises if a forced ``"flex"`` cannot run this call.
    """
    if kind == "relative":
        return "explicit"
    grad_on_cpu = q.device.type == "cpu" and needs_grad
    if backend == "flex":
        if dropout_on:
            raise ValueError(
                "backend='flex' has no attention dropout: use dropout=0, eval(), or 'auto'"
            )
        if grad_on_cpu:
            raise RuntimeError(
                "backend='flex' cannot backpropagate on CPU (PyTorch has no FlexAttention "
                "backward there): run under torch.no_grad(), or use backend='auto'/'sdpa'"
            )
        return "flex"
    if backend != "auto":
        return backend
    s, t = q.shape[2], k.shape[2]
    if (
        kind != "bias"
        or s * t < FLEX_MIN_SCORES
        or dropout_on
        or grad_on_cpu
        or q.dtype not in (torch.float32, torch.float16, torch.bfloat16)
        or not (index_layout or flex_any_positions)
        or not flex_available(q.device.type)
    ):
        return "sdpa"
    return "flex"
