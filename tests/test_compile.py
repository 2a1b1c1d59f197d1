"""Capture-safe forwards (DESIGN.md): for every registered encoding, a layer (the absolute
encoding on the input where that is the family, then Attention with the others) traces into ONE
graph under ``torch.compile(fullgraph=True, dynamic=True)``, is not recompiled as the length
changes, and equals eager.

What catches a host read: ``fullgraph=True`` turns a graph break (``bool(t)``, a branch on a
value, ``.tolist()``) into an error; with dynamic shapes dynamo captures ``.item()`` (and
``int(t.max())``) into the graph instead of breaking it, so the counting backend also fails on
such a node. It counts the graphs too, so a recompile shows as a second one, and it runs each
graph as traced (no code generation): tracing is the part that proves capture safety, and it
keeps this file fast on CPU. One case runs inductor. On CUDA a decode step with a KV cache is
captured in a CUDA graph and replayed against eager.

Bias encodings run ``backend="sdpa"``, which "auto" picks at these lengths (FlexAttention is
compiled on its own, forward-only on CPU: tests/test_flex.py).
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch import nn

from posenc import Attention, KVCache, registry
from posenc.absolute import SinusoidalEncoding
from posenc.bias import ALiBi
from posenc.functional.sinusoidal import sinusoidal_table

DIM, HEADS, KV_HEADS = 16, 2, 1
MAX_LEN = 4096  # learned tables and xPos' center are sized by it
LENGTHS = (8, 33, 100, 257)
NAMES = registry.names()


class Layer(nn.Module):
    """An absolute encoding on the input (if that is the family), then Attention."""

    def __init__(self, name: str) -> None:
        super().__init__()
        family = registry.entry(name).family
        enc = registry.build(name, dim=DIM, num_heads=HEADS, max_len=MAX_LEN)
        self.absolute = enc if family == "absolute" else None
        inner = enc if family in ("rotary", "bias", "relative") else None
        backend = "sdpa" if family == "bias" else "auto"
        self.attn = Attention(DIM, HEADS, KV_HEADS, encoding=inner, backend=backend)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        if self.absolute is not None:
            x = self.absolute(x, positions)
        return self.attn(x, positions, cache=cache)


# What a traced graph may not contain: reads of a tensor's value into Python. With dynamic
# shapes dynamo captures ``.item()`` (``int(t.max())``) as an unbacked symbol instead of breaking
# the graph, so ``fullgraph=True`` alone does not catch it; at run time each is a device sync.
HOST_READS = {"item", "tolist", "_local_scalar_dense", "__bool__", "__int__", "__float__"}


class Graphs:
    """A ``torch.compile`` backend that counts the graphs it is given, fails on a host read in
    one, and runs them as traced (no code generation)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> object:
        self.count += 1
        for node in gm.graph.nodes:
            target = node.target if isinstance(node.target, str) else node.target.__name__
            if node.op in ("call_method", "call_function") and target.split(".")[0] in HOST_READS:
                raise AssertionError(
                    f"the graph reads a tensor value on the host: {node.format_node()}"
                )
        return gm.forward


@pytest.fixture(autouse=True)
def _static_python_floats():
    """Keep Python float attributes (scale, dropout) constants: with ``dynamic=True`` dynamo
    would otherwise pass them in as CPU scalar tensors read by ``.item()`` (free, but it would
    hide the reads this file looks for)."""
    with torch._dynamo.config.patch(specialize_float=True):
        yield


def compiled(layer: nn.Module, backend: object) -> nn.Module:
    torch._dynamo.reset()
    return torch.compile(layer, backend=backend, fullgraph=True, dynamic=True)


@pytest.mark.parametrize("name", NAMES)
def test_one_graph_for_every_length(name: str) -> None:
    layer, graphs = Layer(name), Graphs()
    fn = compiled(layer, graphs)
    for s in LENGTHS:
        x = torch.randn(2, s, DIM)
        torch.testing.assert_close(fn(x), layer(x), rtol=1e-5, atol=1e-5)
    assert graphs.count == 1, f"{graphs.count} graphs: recompiled as the length changed"


@pytest.mark.parametrize("name", NAMES)
def test_one_graph_with_batched_positions_with_gaps(name: str) -> None:
    """``[b, s]`` positions with gaps and a per-row offset: not the index layout."""
    layer, graphs = Layer(name), Graphs()
    fn = compiled(layer, graphs)
    with torch.no_grad():
        for s in LENGTHS:
            x = torch.randn(2, s, DIM)
            i = torch.arange(s)
            positions = torch.stack((2 * i + 5, i + (i >= s // 2) * 7))  # [2, s]
            torch.testing.assert_close(fn(x, positions), layer(x, positions), rtol=1e-5, atol=1e-5)
    assert graphs.count == 1, f"{graphs.count} graphs: recompiled as the length changed"


@pytest.mark.parametrize("name", NAMES)
def test_decode_with_kv_cache_compiles_twice_at_most(name: str) -> None:
    """Prefill (empty cache) and decoding (one token over a growing cache) are two graphs: the
    cache's length changes every step without a recompile. (The prefill is 9 tokens, not 8:
    dynamo gives input sizes of equal value one symbol, and a cache of 8 keys of head_dim 8
    would tie the cache length to the static head_dim for one extra compile.)"""
    layer, graphs = Layer(name).eval(), Graphs()
    fn = compiled(layer, graphs)
    x, pos = torch.randn(2, 13, DIM), torch.arange(13)
    got_cache, want_cache = KVCache(), KVCache()
    got, want = [], []
    with torch.no_grad():
        for lo, hi in [(0, 9)] + [(i, i + 1) for i in range(9, 13)]:
            xi = x[:, lo:hi].clone()  # fresh tensors, as a decode loop has (not views of one)
            p = pos[lo:hi].clone()  # explicit, as absolute encodings need them when decoding
            got.append(fn(xi, p, got_cache))
            want.append(layer(xi, p, want_cache))
    torch.testing.assert_close(torch.cat(got, 1), torch.cat(want, 1), rtol=1e-5, atol=1e-5)
    assert graphs.count <= 2, f"{graphs.count} graphs for prefill + decode"


@pytest.mark.parametrize("name", ["none", "transformer-xl"])
def test_long_lengths_reuse_the_graph(name: str) -> None:
    """8 .. 4096 with one graph (two encodings only: the long calls are the slow part)."""
    layer, graphs = Layer(name), Graphs()
    fn = compiled(layer, graphs)
    with torch.no_grad():
        for s in (8, 4096):
            x = torch.randn(1, s, DIM)
            torch.testing.assert_close(fn(x), layer(x), rtol=1e-4, atol=1e-5)
    assert graphs.count == 1


def test_inductor_sandwich() -> None:
    """One encoding through real code generation (inductor, dynamic shapes): Sandwich, whose
    float64 embedding product is the least ordinary op here."""
    layer = Layer("sandwich")
    torch._dynamo.reset()
    fn = torch.compile(layer, fullgraph=True, dynamic=True)
    with torch.no_grad():
        for s in (8, 33, 100):
            x = torch.randn(2, s, DIM)
            torch.testing.assert_close(fn(x), layer(x), rtol=1e-4, atol=1e-5)


def test_a_host_read_is_caught() -> None:
    """The harness fails when a forward reads a value back: a bias sized by ``int(max())``."""

    class HostReadingALiBi(ALiBi):
        def bias(self, positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
            n = int(k_positions.max()) + 1  # what Sandwich used to do to size its table
            table = torch.zeros(n, device=k_positions.device)  # [n]
            return super().bias(positions, k_positions) + table[k_positions]

    attn = Attention(DIM, HEADS, encoding=HostReadingALiBi(HEADS), backend="sdpa")
    fn = compiled(attn, Graphs())
    with pytest.raises(Exception, match="reads a tensor value on the host"):
        fn(torch.randn(1, 8, DIM))


@pytest.mark.parametrize(("dim", "layout"), [(16, "interleaved"), (16, "concat"), (15, "fairseq")])
def test_sinusoidal_device_formula_is_the_functional_table(dim: int, layout: str) -> None:
    """The formula SinusoidalEncoding computes on devices and under compile (frequencies already
    on the device) gives the functional table's numbers exactly."""
    enc = SinusoidalEncoding(dim, layout=layout, cache_len=4)
    positions = torch.tensor([[0, 3, 4095, 10**6]])
    want = sinusoidal_table(positions, dim, layout=layout)
    torch.testing.assert_close(enc._formula(positions), want, rtol=0, atol=0)


# --- CUDA graphs -------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("name", NAMES)
def test_cuda_graph_decode_step_equals_eager(name: str) -> None:
    """Capture one decode step (one token over a 12-token KV cache) in a CUDA graph, replay it
    with new inputs and positions, compare with eager from the same cache. Any host read in the
    forward (``.item()``, a synchronizing copy) makes the capture itself fail."""
    layer = Layer(name).cuda().eval()
    x = torch.randn(2, 12, DIM, device="cuda")
    cache = KVCache()
    with torch.no_grad():
        layer(x, torch.arange(12, device="cuda"), cache)
    prefix = (cache.k, cache.v, cache.positions, cache.index_layout)
    x_in = torch.randn(2, 1, DIM, device="cuda")  # static inputs of the graph
    pos_in = torch.tensor([12], device="cuda")

    def step() -> torch.Tensor:
        cache.k, cache.v, cache.positions, cache.index_layout = prefix  # the same prefix
        return layer(x_in, pos_in, cache)

    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: per-device constants are copied here
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        for p in (12, 13, 40):
            x_in.copy_(torch.randn_like(x_in))
            pos_in.fill_(p)
            graph.replay()
            torch.testing.assert_close(out, step(), rtol=1e-5, atol=1e-5)
