"""Constant tensors of an encoding that move with its module and never change dtype.

At the bottom of the package (it imports nothing of posenc): every family keeps its
frequencies, slopes and distance tables here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class DeviceConstants(nn.Module):
    """Constant tensors of an encoding (frequencies, slopes, distance tables): non-persistent
    buffers that move with the module and keep their dtype.

    ``module.to(bfloat16)`` (or ``.half()``, ``.float()``) casts every floating buffer, and a
    rounded ``inv_freq`` or slope shifts every position (the classic ``inv_freq`` bug); these
    take the device of such a conversion and never its dtype. Being on the module's device, they
    cost no host-to-device copy per call (a stall, and forbidden in CUDA-graph capture), and as
    buffers ``torch.compile`` sizes them statically. ``state_dict`` does not hold them.
    """

    def __init__(self, **tensors: torch.Tensor) -> None:
        super().__init__()
        for name, tensor in tensors.items():
            self.register_buffer(name, tensor, persistent=False)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Any:
        for name, buf in self._buffers.items():
            if buf is not None:
                moved = fn(buf)  # [x] -> [x] on the new device, maybe in a new dtype
                self._buffers[name] = moved if moved.dtype == buf.dtype else buf.to(moved.device)
        return self

    def reset_(self, **tensors: torch.Tensor) -> None:
        """Set the constants to ``tensors`` (recomputed by the owner's ``reset_parameters``), on
        the device each one is on now and in the dtype given: after ``to_empty()`` the buffers
        hold uninitialized memory (or, on the meta device, none)."""
        for name, tensor in tensors.items():
            old = self._buffers[name]
            self._buffers[name] = tensor.to(old.device if old is not None else tensor.device)

    def get(self, name: str, device: torch.device) -> torch.Tensor:
        """The constant ``name`` on ``device``: a copy only when the module was not moved there."""
        tensor = self._buffers[name]
        assert tensor is not None
        return tensor if tensor.device == device else tensor.to(device)
