"""torch.export and ONNX of a model that uses posenc's RoPE (docs/kernels.md, "torch.export and
ONNX"): with the default backend the graph keeps posenc's custom op ``posenc::rope_qk``, which
only a process that imports posenc can run; with ``backend="torch"`` it is plain aten ops, runs
where posenc is not installed, and equals eager and the rotation formula."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.export import Dim

from posenc.rotary import RotaryEmbedding

D = 64


class Rotate(torch.nn.Module):
    """A user's attention block, reduced to its rotation: q, k ``[b, h, s, d]``, positions ``[s]``."""

    def __init__(self, backend: str) -> None:
        super().__init__()
        self.rope = RotaryEmbedding(D, backend=backend)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rope(q, k, positions=positions)


def inputs(seq: int, start: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seq)
    q = torch.randn(2, 4, seq, D, generator=g)
    k = torch.randn(2, 2, seq, D, generator=g)  # GQA: 4 query heads, 2 key heads
    return q, k, torch.arange(start, start + seq)


def exported(backend: str) -> torch.export.ExportedProgram:
    seq = Dim("seq", min=2, max=8192)
    return torch.export.export(
        Rotate(backend), inputs(16, 0), dynamic_shapes=({2: seq}, {2: seq}, {0: seq})
    )


def posenc_ops(program: torch.export.ExportedProgram) -> set[str]:
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    return {t for t in targets if t.startswith("posenc")}


def rope_float64(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """RoPE "half" (NeoX/Llama) by the paper's formula in float64, written out independently:
    pair ``(x_i, x_{i+d/2})`` turned by ``p * base^(-2i/d)``."""
    x = x.double()
    half = D // 2
    theta = torch.tensor([10000.0 ** (-2 * i / D) for i in range(half)], dtype=torch.float64)
    angle = positions.double()[:, None] * theta[None, :]  # [s, d/2]
    cos, sin = angle.cos(), angle.sin()
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


def test_default_backend_keeps_the_custom_op_in_the_graph() -> None:
    assert posenc_ops(exported("auto")) == {"posenc.rope_qk.default"}


def test_torch_backend_exports_plain_aten_that_equals_eager() -> None:
    program = exported("torch")
    assert posenc_ops(program) == set()
    for seq, start in ((16, 0), (40, 5000), (3, 8000)):  # other lengths: the seq dim is dynamic
        q, k, positions = inputs(seq, start)
        got = program.module()(q, k, positions)
        for backend in ("torch", "auto"):  # eager, reference and fused
            want = Rotate(backend)(q, k, positions)
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
        for a, x in zip(got, (q, k), strict=True):
            torch.testing.assert_close(a.double(), rope_float64(x, positions), rtol=0, atol=2e-5)


def test_exported_program_loads_and_runs_without_posenc(tmp_path: Path) -> None:
    """The saved program runs in a process where ``import posenc`` fails."""
    torch.export.save(exported("torch"), tmp_path / "rotate.pt2")
    q, k, positions = inputs(24, 300)
    torch.save((q, k, positions), tmp_path / "inputs.pt")
    code = (
        "import sys; sys.modules['posenc'] = None\n"
        "import torch\n"
        "program = torch.export.load(sys.argv[1] + '/rotate.pt2')\n"
        "args = torch.load(sys.argv[1] + '/inputs.pt')\n"
        "torch.save(tuple(program.module()(*args)), sys.argv[1] + '/out.pt')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for a, b in zip(torch.load(tmp_path / "out.pt"), Rotate("torch")(q, k, positions), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.skipif(
    importlib.util.find_spec("onnx") is None or importlib.util.find_spec("onnxscript") is None,
    reason="torch.onnx.export(dynamo=True) needs onnx and onnxscript, not installed",
)
def test_onnx_export_with_torch_backend(tmp_path: Path) -> None:
    q, k, positions = inputs(16, 0)
    program = torch.onnx.export(Rotate("torch"), (q, k, positions), dynamo=True)
    assert program is not None
    program.save(str(tmp_path / "rotate.onnx"))
    assert (tmp_path / "rotate.onnx").stat().st_size > 0
    if importlib.util.find_spec("onnxruntime") is not None:
        got = program(q, k, positions)  # runs the model in onnxruntime
        for a, b in zip(got, Rotate("torch")(q, k, positions), strict=True):
            torch.testing.assert_close(torch.as_tensor(a), b, rtol=1e-5, atol=1e-5)
