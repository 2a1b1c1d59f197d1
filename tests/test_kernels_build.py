"""The native CPU kernel's build: instruction-set variants chosen at run time (each one equal to
the pure-PyTorch reference), ``POSENC_CPU_ISA``, the build's log lines and ``posenc kernels``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from posenc.cli import app
from posenc.kernels import cpu_rope, rope_qk
from posenc.kernels.cpu_rope import ISA_VARIANTS, choose_isa, cpu_kernel_status

CPU_REASON = cpu_kernel_status()
needs_kernel = pytest.mark.skipif(bool(CPU_REASON), reason=CPU_REASON or "-")
# The variants this CPU runs, best first ("generic" always among them).
RUNS = choose_isa("auto")[0] if not CPU_REASON else []


@pytest.fixture
def restore_kernel() -> Iterator[None]:
    """Put the process's kernel back as it was (tests load other variants)."""
    state = (cpu_rope._lib, cpu_rope._status, cpu_rope._loaded)
    yield
    cpu_rope._lib, cpu_rope._status, cpu_rope._loaded = state


def _tables(n: int, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos, sin [n, r/2], angles in float64."""
    inv_freq = 10000.0 ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq
    return ang.cos().float(), ang.sin().float()


def _same_as_reference(dtype: torch.dtype, d: int, layout: str, inplace: bool = False) -> None:
    """The loaded kernel against the reference (float32 math, then one round to nearest even
    for bf16): the same bits, NaN for NaN. Magnitudes 1e-30..1e30 reach bf16's denormals."""
    g = torch.Generator().manual_seed(d)
    q = torch.randn(2, 3, 37, d, generator=g) * 10.0 ** torch.randint(-30, 30, (2, 3, 37, 1))
    q, k = q.to(dtype), torch.randn(2, 2, 37, d, generator=g).to(dtype)
    q[0, 0, 0, 1], q[1, 2, 3, d - 1], k[0, 1, 5, 0] = float("nan"), float("inf"), float("-inf")
    cos, sin = _tables(40, d)
    pos = torch.randint(0, 40, (2, 37), generator=g)
    want = rope_qk(q, k, cos, sin, positions=pos, layout=layout, backend="torch")
    if inplace:
        got = (q.clone(), k.clone())
        rope_qk(*got, cos, sin, positions=pos, layout=layout, backend="cpu", inplace=True)
    else:
        got = rope_qk(q, k, cos, sin, positions=pos, layout=layout, backend="cpu")
    for a, b in zip(got, want, strict=True):
        assert torch.equal(
            torch.nan_to_num(a.float(), nan=7.0), torch.nan_to_num(b.float(), nan=7.0)
        )


@needs_kernel
@pytest.mark.parametrize("isa", RUNS)
def test_each_variant_this_cpu_runs_equals_the_reference(isa: str, restore_kernel: None) -> None:
    """Every variant, every head size class: 2 * LANES blocks (AVX2's bf16 blocks hold their
    elements out of order, the tables too), single vectors, single pairs (d = 40, 48, 16)."""
    assert cpu_rope.load_cpu_kernel(isa) == ""
    assert cpu_rope._lib is not None and cpu_rope._lib.posenc_rope_isa().decode() == isa
    for dtype in (torch.float32, torch.bfloat16):
        for d in (128, 64, 48, 40, 16):
            for layout in ("half", "interleaved"):
                _same_as_reference(dtype, d, layout)
        _same_as_reference(dtype, 128, "half", inplace=True)


@needs_kernel
def test_posenc_cpu_isa_forces_a_variant(
    monkeypatch: pytest.MonkeyPatch, restore_kernel: None
) -> None:
    monkeypatch.setenv("POSENC_CPU_ISA", "generic")
    assert cpu_rope.load_cpu_kernel() == ""
    assert cpu_rope.cpu_kernel_info().isa == "generic"
    assert cpu_rope.cpu_kernel_info().why == "POSENC_CPU_ISA=generic"
    _same_as_reference(torch.bfloat16, 128, "half")
    _same_as_reference(torch.float32, 64, "interleaved")
    monkeypatch.setenv("POSENC_CPU_ISA", "avx")
    with pytest.raises(ValueError, match="POSENC_CPU_ISA must be auto or one of avx512bf16, "):
        cpu_rope.load_cpu_kernel()


def test_the_variant_follows_the_cpu_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POSENC_CPU_ISA", raising=False)
    read_flags = cpu_rope.cpu_features
    cases = {
        frozenset({"sse2", "avx", "avx2", "fma"}): ["avx2", "generic"],
        ISA_VARIANTS["avx512"][1]: ["avx512", "avx2", "generic"],
        ISA_VARIANTS["avx512bf16"][1]: ["avx512bf16", "avx512", "avx2", "generic"],
        frozenset({"sse2", "avx"}): ["generic"],
        frozenset(): ["generic"],  # another architecture
    }
    for flags, want in cases.items():
        monkeypatch.setattr(cpu_rope, "cpu_features", lambda flags=flags: flags)
        assert choose_isa()[0] == want
    monkeypatch.setattr(cpu_rope, "cpu_features", lambda: frozenset({"avx2", "fma"}))
    with pytest.raises(ValueError, match=r"POSENC_CPU_ISA=avx512 needs .*\(avx512bw, avx512f, "):
        choose_isa("avx512")
    monkeypatch.setattr(cpu_rope.platform, "machine", lambda: "aarch64")
    assert read_flags() == frozenset()


def test_no_variant_is_built_for_the_host_only() -> None:
    """Explicit flags per variant, never -march=native: a cached build runs on any CPU that has
    the variant's features (a shared home or image), and the cache key needs no CPU identity."""
    flags = [f for sets in cpu_rope._FLAG_SETS for f in sets]
    flags += [f for v, _ in ISA_VARIANTS.values() for f in v] + list(cpu_rope._COMMON_FLAGS)
    assert not [f for f in flags if "native" in f]


@needs_kernel
def test_posenc_kernels_shows_builds_and_logs(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    restore_kernel: None,
) -> None:
    """In a fresh cache: the status says not built and builds nothing; --build builds, logs it
    on posenc.kernels (INFO) and prints the backend each typical call takes."""
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("POSENC_CPU_ISA", raising=False)
    cpu_rope._lib, cpu_rope._status, cpu_rope._loaded = None, None, None  # a fresh process
    runner = CliRunner()
    res = runner.invoke(app, ["kernels"])
    assert res.exit_code == 0, res.output
    assert "CPU kernel:  not built" in res.output and "--build" in res.output
    assert f"variant:     {RUNS[0]}" in res.output and str(tmp_path) in res.output
    assert not list(tmp_path.rglob("*.so"))
    with caplog.at_level(logging.INFO, logger="posenc.kernels"):
        res = runner.invoke(app, ["kernels", "--build"])
    assert res.exit_code == 0, res.output
    built = list(tmp_path.rglob("*.so"))
    assert len(built) == 1 and built[0].name.startswith(f"rope_cpu_{RUNS[0]}_")
    messages = [r.getMessage() for r in caplog.records if r.name == "posenc.kernels"]
    assert messages[0].startswith(f"building the CPU rotary kernel ({RUNS[0]}) with ")
    assert messages[1].startswith(f"built the CPU rotary kernel ({RUNS[0]}) in ")
    assert "CPU kernel:  built now in" in res.output and str(built[0]) in res.output
    rows = [line.split() for line in res.output.splitlines() if line.startswith("  ")]
    chosen = {" ".join(r[:4]): r[4] for r in rows if r[0] == "rope_qk,"}
    assert chosen["rope_qk, CPU float32 1x32x16x128"] == "cpu"
    assert chosen["rope_qk, CPU bfloat16 1x32x16x128"] == "cpu"
    assert chosen["rope_qk, CPU float16 1x32x16x128"] == "torch"
    assert "the CPU kernel takes float32 or bfloat16, got torch.float16" in res.output
    cpu_rope._lib, cpu_rope._status, cpu_rope._loaded = None, None, None
    res = runner.invoke(app, ["kernels"])  # a later process: loaded from the cache
    assert "CPU kernel:  built (cached), loaded" in res.output


def test_posenc_kernels_refuses_a_bad_isa_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POSENC_CPU_ISA", "sse9")
    monkeypatch.setattr(cpu_rope, "_status", None)
    res = CliRunner().invoke(app, ["kernels"])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [
        "error: POSENC_CPU_ISA must be auto or one of avx512bf16, avx512, avx2, generic, got 'sse9'"
    ]
