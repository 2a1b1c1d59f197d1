"""RotaryEmbedding is capture-safe: ``torch.compile(fullgraph=True, dynamic=True)`` traces it with
no graph break and one graph for every length, with every scaling type, and (on CUDA) a decode
step replays from a CUDA graph. Both would fail on a host read (``.item()``, ``int(t.max())``,
``bool(t)``) anywhere on the forward path.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from posenc.rotary import RotaryEmbedding

dynamo = pytest.importorskip("torch._dynamo")
from torch._dynamo.utils import counters  # noqa: E402

ORIG = "original_max_position_embeddings"
SCALINGS: dict[str, dict[str, Any] | None] = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "ntk": {"rope_type": "ntk", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, ORIG: 64},
    "yarn": {"rope_type": "yarn", "factor": 4.0, ORIG: 64},
    "longrope": {
        "rope_type": "longrope", "factor": 4.0, ORIG: 64,
        "short_factor": [1.0 + i / 10 for i in range(8)], "long_factor": [2.0 + i for i in range(8)],
    },
    "llama3": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        ORIG: 64,
    },
    "proportional": {"rope_type": "proportional", "factor": 1.0},
}  # fmt: skip
LENGTHS = (8, 33, 100, 257, 1024, 4096)  # across the 64-token switch points and the table


def _compiled(rope: RotaryEmbedding) -> Any:
    dynamo.reset()
    counters.clear()
    return torch.compile(rope, fullgraph=True, dynamic=True, backend="eager")


@pytest.mark.parametrize("name", list(SCALINGS))
def test_fullgraph_dynamic_one_graph_for_every_length(name: str) -> None:
    rope = RotaryEmbedding(
        16, scaling=SCALINGS[name], rotary_dim=8 if name == "proportional" else None
    )
    compiled = _compiled(rope)
    for s in LENGTHS:
        q, k = torch.randn(2, 4, s, 16), torch.randn(2, 2, s, 16)
        got, want = compiled(q, k), rope(q, k)
        # Eager serves table rows, the graph computes cos/sin: the same arithmetic per position.
        torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])


@pytest.mark.parametrize("name", ["default", "dynamic", "longrope"])
def test_decode_steps_with_a_cache_share_one_graph(name: str) -> None:
    """Prefill, then one token at a time past the original length: batch positions [b, 1]."""
    rope = RotaryEmbedding(16, scaling=SCALINGS[name])
    compiled = _compiled(rope)
    for step in (3, 40, 63, 64, 65, 300):
        q, k = torch.randn(2, 4, 1, 16), torch.randn(2, 2, 1, 16)
        pos = torch.tensor([[step], [step + 7]])
        torch.testing.assert_close(compiled(q, k, pos), rope(q, k, pos), rtol=0, atol=2e-6)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_inductor_compiles_the_fused_op() -> None:
    """The real compiler, not only the tracer: the custom op's fake kernel and functionalization."""
    rope = RotaryEmbedding(16, scaling=SCALINGS["yarn"])
    dynamo.reset()
    compiled = torch.compile(rope, fullgraph=True, dynamic=True)
    for s in (8, 100):
        q, k = torch.randn(1, 4, s, 16), torch.randn(1, 2, s, 16)
        torch.testing.assert_close(compiled(q, k), rope(q, k), rtol=0, atol=2e-6)


def test_negative_control_a_host_read_breaks_the_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests above can fail: the old max-position read on every call is a graph break."""
    rope = RotaryEmbedding(16)
    original = RotaryEmbedding._traced_frequencies

    def with_host_read(self: RotaryEmbedding, p: torch.Tensor, kp: torch.Tensor) -> Any:
        if int(p.max()) >= self.cache_len:  # the host read this module must not do
            pass
        return original(self, p, kp)

    monkeypatch.setattr(RotaryEmbedding, "_traced_frequencies", with_host_read)
    compiled = _compiled(rope)
    with pytest.raises(Exception, match=r"(?i)data-dependent|graph break|item|Unsupported"):
        compiled(torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need CUDA")
def test_cuda_graph_captures_and_replays_a_decode_step() -> None:
    dev = torch.device("cuda")
    rope = RotaryEmbedding(128, 500000.0, scaling=SCALINGS["llama3"] | {ORIG: 8192})
    q = torch.randn(1, 32, 1, 128, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, 8, 1, 128, device=dev, dtype=torch.bfloat16)
    pos = torch.tensor([5], device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture: kernels, caches
        for _ in range(3):
            rope(q, k, pos)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_q, out_k = rope(q, k, pos)
    for step in (6, 100, 9000, 40000):
        q.copy_(torch.randn_like(q))
        k.copy_(torch.randn_like(k))
        pos.fill_(step)
        graph.replay()
        want_q, want_k = rope(q, k, pos)
        torch.testing.assert_close(out_q, want_q, rtol=0, atol=0)
        torch.testing.assert_close(out_k, want_k, rtol=0, atol=0)


def test_mrope_compiles_fullgraph_with_one_graph() -> None:
    from posenc.rotary import MRoPE

    rope = MRoPE(16, [2, 3, 3], scaling=SCALINGS["dynamic"])
    compiled = _compiled(rope)
    for s in (8, 33, 100):
        q, k = torch.randn(1, 2, s, 16), torch.randn(1, 2, s, 16)
        pos = torch.stack([torch.arange(s), torch.arange(s) // 2, torch.arange(s) % 5])[:, None]
        torch.testing.assert_close(compiled(q, k, pos), rope(q, k, pos), rtol=0, atol=2e-6)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])
