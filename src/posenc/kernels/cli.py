"""``posenc kernels``: the native CPU kernel's state (built or not, where, with what, which
instruction-set variant and why), ``--build`` to build it now, and which backend each public
call takes for typical inputs, with the reason (:mod:`posenc.kernels.backends`' own choice).

Nothing is built without ``--build``: a cached kernel is loaded (milliseconds), a missing one is
reported as such, and the backend table then waits for the build.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import typer

from ..cli_errors import fail

# A small prefill shape: the choice depends on the device, the dtypes and gradients, never on
# the size (select_backend memoizes it per device type and dtype).
_SHAPE = (1, 32, 16, 128)


def _compiler_version(cc: str) -> str:
    """``cc``'s first ``--version`` line (what the cache key's compiler name stands for)."""
    try:
        res = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{cc} ({type(e).__name__})"
    first = (res.stdout or res.stderr).strip().splitlines()
    return f"{cc} ({first[0]})" if first else cc


def _state_line(status: str, seconds: float | None) -> str:
    if status == "":
        if seconds is not None:
            return f"built now in {seconds:.1f} s, loaded"
        return "built (cached), loaded"
    if status == "not tried yet":
        return (
            "not built: it builds at the first call on CPU tensors (a few seconds of compiler "
            "time, once per cache); 'posenc kernels --build' builds it now"
        )
    return f"unavailable: {status} (calls on CPU tensors use the pure-PyTorch reference)"


def _print_status() -> bool:
    """Print the CPU kernel's lines; True when it is loaded."""
    from .backends import triton_status
    from .cpu_rope import ISA_VARIANTS, cpu_features, cpu_kernel_info

    info = cpu_kernel_info()
    have = cpu_features()
    runs = [n for n, (_, need) in ISA_VARIANTS.items() if need <= have]
    typer.echo(f"CPU kernel:  {_state_line(info.status, info.build_seconds)}")
    typer.echo(f"variant:     {info.isa}: {info.why}")
    typer.echo(
        f"             this CPU runs {', '.join(runs)} (POSENC_CPU_ISA=<variant> forces one)"
    )
    typer.echo(
        f"compiler:    {_compiler_version(info.compiler) if info.compiler else 'none found'}"
    )
    typer.echo(f"cache:       {info.path if info.path else '-'}")
    triton = triton_status()
    typer.echo(f"Triton:      {triton or 'importable (CUDA/XPU tensors, or TRITON_INTERPRET=1)'}")
    return info.status == ""


def _cases() -> list[tuple[str, Callable[[], tuple[object, tuple[object, ...]]]]]:
    """(label, inputs) of typical calls: the tensor and the tables rope_qk receives."""
    import torch

    def tables(dtype: torch.dtype = torch.float32, grad: bool = False) -> tuple[object, ...]:
        cos = torch.ones(_SHAPE[2], _SHAPE[3] // 2, dtype=dtype, requires_grad=grad)
        return cos, torch.zeros_like(cos, requires_grad=grad)

    def dropin() -> tuple[object, tuple[object, ...]]:
        # What posenc.hf.apply_rotary_pos_emb hands rope_qk for transformers' bf16 [1, s, d]
        from ..hf.rotary import half_tables

        cos = torch.ones(1, _SHAPE[2], _SHAPE[3], dtype=torch.bfloat16)
        return torch.empty(_SHAPE, dtype=torch.bfloat16), half_tables(cos, cos, "cat")

    shape = "x".join(map(str, _SHAPE))
    cases = [
        (f"rope_qk, CPU float32 {shape}", lambda: (torch.empty(_SHAPE), tables())),
        (
            f"rope_qk, CPU bfloat16 {shape}",
            lambda: (torch.empty(_SHAPE, dtype=torch.bfloat16), tables()),
        ),
        (f"rope_qk, CPU float16 {shape}", lambda: (torch.empty(_SHAPE).half(), tables())),
        (
            "rope_qk, CPU float32, cos/sin need grad",
            lambda: (torch.empty(_SHAPE), tables(grad=True)),
        ),
        ("hf.apply_rotary_pos_emb, CPU bf16 tables", dropin),
    ]
    if torch.cuda.is_available():
        cases.append(
            (
                f"rope_qk, CUDA bfloat16 {shape}",
                lambda: (torch.empty(_SHAPE, dtype=torch.bfloat16, device="cuda"), tables()),
            )
        )
    return cases


def _print_backends() -> None:
    """Which backend ``backend="auto"`` takes for each typical input, and why."""
    import torch

    from . import backends

    typer.echo("\nbackend='auto' (rope_qk; RotaryEmbedding, the drop-in and apply_posenc call it):")
    for label, make in _cases():
        x, tables = make()
        assert isinstance(x, torch.Tensor)
        ts = tuple(t for t in tables if isinstance(t, torch.Tensor))
        chosen = backends.select_backend("auto", x, ts)
        candidate = "triton" if x.device.type in ("cuda", "xpu") else "cpu"
        if chosen == "torch":
            why = backends._why_not(candidate, x, ts) or "no fused kernel applies"
        elif chosen == "cpu":
            why = "the native CPU kernel takes float32 and bfloat16 CPU tensors"
        else:
            why = "the Triton kernel, q and k in one launch"
        typer.echo(f"  {label:44s} {chosen:7s} {why}")
    if not torch.cuda.is_available():
        typer.echo(
            f"  {'CUDA tensors':44s} {'triton':7s} when triton imports (no CUDA device here)"
        )
    typer.echo(
        f"  {'any of these under torch.compile':44s} {'same':7s} chosen when the graph is traced; "
        "the kernel runs as the custom op posenc::rope_qk, one node (fullgraph)"
    )


def kernels_command(build: bool = False) -> None:
    """The native CPU kernel: built or not, cache path, compiler, the instruction-set variant
    chosen for this CPU; which backend each call takes and why (the command's options are
    declared in :mod:`posenc.cli`, which imports this module only when the command runs:
    ``posenc.kernels`` imports torch)."""
    _report(build)  # the build's own log lines print as it runs (posenc.cli's command logging)


def _report(build: bool) -> None:
    from . import cpu_rope

    try:
        info = cpu_rope.cpu_kernel_info()
        if info.isa == "-":
            fail(info.why)
        if build or info.built or info.compiler is None or cpu_rope.disabled():
            cpu_rope.cpu_kernel_status()  # nothing to compile unless --build or not cached
    except ValueError as e:  # a bad POSENC_CPU_ISA
        fail(str(e))
    _print_status()
    if cpu_rope.cpu_kernel_info().status != "not tried yet":
        _print_backends()
    else:
        typer.echo("\nwhich backend each call takes: after the build ('posenc kernels --build')")
