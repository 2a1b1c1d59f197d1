"""The named presets (``cpu-small``, ``cpu``, ``gpu``, ``gpu-small``): a table of :class:`LabConfig`
that only needs the configuration dataclasses (the CLI's option table reads it for ``--help``).
"""

from __future__ import annotations

from .config import GPU_SMALL_ENCODINGS, DataConfig, EvalConfig, LabConfig, ModelShape, TrainConfig

# Presets. cpu-small is the README's first command: every default encoding (13 with the rotary,
# bias and relative families) trained and evaluated in posenc.lab.DEFAULT_RUN_TIME (measured;
# the wall time of each cell is in its result row and the report). cpu is the same study larger (L=128,
# 8x the tokens, 3x the parameters, 3 seeds): about an hour per seed on two idle cores with
# --threads 2 (estimated from measured throughput, 9K tokens/s on one core, 17K on two). gpu is sized for one H100: a
# ~100M-parameter model at the ALiBi paper's train length of 512, evaluated to 16x (8192).
# gpu-small is that setting at 25M parameters and 4.9M tokens per encoding, compiled, sized for
# the few minutes `make gpu-check` has (its sizing is written above its entry).
PRESETS: dict[str, LabConfig] = {
    "cpu-small": LabConfig(
        preset="cpu-small",
        train_len=64,
        model=ModelShape(dim=128, num_layers=2, num_heads=4),
        # 500 x 16 x 64 = 512K training bytes per encoding: ~20-40 s each on one core.
        train=TrainConfig(steps=500, batch_size=16, lr=3e-3, warmup_steps=40),
        eval=EvalConfig(lengths=("1x", "2x", "4x", "8x"), tokens=32768, batch_tokens=8192),
        ckpt_every=100,
        # One thread. Measured on 2 cores: two threads train this model 1.7x faster on an idle
        # machine but up to 20x slower on one shared with other work (OpenMP threads spinning on
        # each other); one thread also gives the same numbers bit for bit on any core count.
        # `--threads 2` on a machine of your own.
        threads=1,
    ),
    "cpu": LabConfig(
        preset="cpu",
        train_len=128,
        model=ModelShape(dim=192, num_layers=3, num_heads=6),
        # 2000 x 16 x 128 = 4M tokens per encoding, 8x cpu-small's.
        train=TrainConfig(steps=2000, batch_size=16, lr=2e-3, warmup_steps=100),
        # Three seeds: the report's 95% intervals (mean ± t * s / sqrt(3)) say which differences
        # are noise; cpu-small stays at one seed to keep its few minutes.
        seeds=(0, 1, 2),
        eval=EvalConfig(lengths=("1x", "2x", "4x", "8x"), tokens=65536, batch_tokens=16384),
        ckpt_every=250,
    ),
    "gpu": LabConfig(
        preset="gpu",
        train_len=512,
        # 14 layers x (4 + 8) x 768^2 ~= 99M parameters in the blocks (+ a 256 x 768 embedding).
        model=ModelShape(dim=768, num_layers=14, num_heads=12),
        # 64 x 512 = 32K tokens a step, 10K steps ~= 330M tokens.
        train=TrainConfig(steps=10000, batch_size=64, lr=6e-4, warmup_steps=500),
        # Eval batches of 16K tokens: a materialized bias at 8192 is [2, 12, 8192, 8192] fp32 = 6 GB.
        eval=EvalConfig(lengths=("1x", "2x", "4x", "8x", "16x"), tokens=262144, batch_tokens=16384),
        # The stdlib with its tests is ~31 MB: ~10 epochs at this budget, so a 100M model will
        # overfit it. Give it a bigger corpus where one is at hand: --dataset
        # wikitext:wikitext-103-raw-v1 (the ALiBi paper's data, ~540 MB) or --text.
        data=DataConfig(include_tests=True),
        ckpt_every=500,
    ),
    # gpu-small: the ALiBi paper's setting (train at L = 512; evaluate at 512, 1024, 2048 and
    # 4096, with the RoPE rescalings) small enough to run inside `make gpu-check`: every default
    # encoding in at most 5 minutes on one H100/H200, trained the way a GPU run is: bf16 autocast,
    # compiled blocks (compile=True: posenc.lab.training.schedule.compile_blocks), FlexAttention for the
    # biases wherever `Attention`'s "auto" picks it on CUDA (the eval lengths >= 1024; training
    # at 512 stays below its threshold and uses SDPA). Sized from measured CPU throughput
    # (the method and its assumptions: benchmarks/README.md, "Sizing gpu-small"): this model (25.3M parameters, ~177 MFLOP per trained token) trained
    # at 252-427 tokens/s on one thread of the 2-core EPYC VM in float32 (RoPE: 347 tokens/s,
    # 61 GFLOP/s). Assumed CPU -> H200 factor ~3,200 = 989 dense bf16 TFLOP/s x 20% utilization
    # (an eager 25M model) / 61 GFLOP/s, times 1.3 compiled; plus 5 ms a step of host overhead
    # (multi-tensor AdamW on CUDA), 8 s per encoding to compile its block and 5 s per
    # FlexAttention compile (5 biases x 3 lengths). Estimate: 63 s of training (300 steps x 16K
    # tokens = 4.9M tokens per encoding, under half an epoch of the 12 MB stdlib), 104 s of model
    # compiles, 75 s of FlexAttention compiles, 28 s of start-up and evaluation: ~270 s, 1.1x
    # inside the 5 minutes. Eager it would be ~180 s: at 300 steps per encoding the compile costs
    # more time than it saves. The published comparison's encodings come first, so a run cut
    # short by gpu-check's time limit still has them.
    "gpu-small": LabConfig(
        preset="gpu-small",
        encodings=GPU_SMALL_ENCODINGS,
        train_len=512,
        # 8 blocks x 12 x 512^2 = 25.2M parameters (+ a 256 x 512 embedding); head_dim 64.
        model=ModelShape(dim=512, num_layers=8, num_heads=8),
        train=TrainConfig(steps=300, batch_size=32, lr=1.5e-3, warmup_steps=30),
        # 64K test bytes per length: 128 windows at L, 16 at 8L. Eval batches of 32K tokens
        # keep the explicit (relative-family) scores at 4096 to a few GiB.
        eval=EvalConfig(lengths=("1x", "2x", "4x", "8x"), tokens=65536, batch_tokens=32768),
        # No mid-run checkpoints: each would write model + optimizer (~300 MB) for a cell that
        # takes seconds; the final weights are still saved.
        ckpt_every=1000,
        compile=True,
    ),
}

#: The presets sized for a GPU (the lab warns when one runs on the CPU).
GPU_PRESETS: tuple[str, ...] = ("gpu", "gpu-small")


def preset(name: str) -> LabConfig:
    """The named preset (``cpu-small``, ``cpu``, ``gpu``, ``gpu-small``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]
