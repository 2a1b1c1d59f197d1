"""Inside the trained window: does STRING (which remaps the undertrained far positions instead
of stretching past the window) raise SmolLM2-135M's effective length below its trained 8k?
The model as trained beside STRING, ReRoPE, Leaky ReRoPE and Su's log-n query scale, on the
needle at three depths, eight samples a cell asked four to a prefilled context
(``--questions-per-context 4``: two haystacks a cell, each holding four needles, each asked
alone), so that the paired test has samples to work with:

    posenc extend smollm2 --methods none,string,rerope,leaky_rerope,logn --lengths 2k,4k,8k \\
        --documents 0 --tasks niah_single_2 --task-depths 0.1,0.5,0.9 --samples 8 \\
        --questions-per-context 4 --threads 1 --dtype bfloat16 \\
        --out benchmarks/studies/smollm2-135m-window

Run in pieces by length, 4k and 8k first (where STRING moves positions: at 2k every distance
is below its shifted offset of 0.33 x 8k, and it is the model as trained), each call skipping
every cell already in the folder, so the study resumes from its committed rows. The model as
trained and STRING ran first; ReRoPE, Leaky ReRoPE and the log-n query scale joined later on the
same prompts (``--methods=rerope,leaky_rerope,logn``); more join the same way.

    python benchmarks/extend_smollm2_window.py [LENGTH ...] [--methods=A,B] [--threads=N]
"""

import sys

from study_args import packaged, start  # benchmarks/, beside this script

from posenc.extend.methods.names import parse_methods
from posenc.extend.study.config import StudyConfig, parse_lengths
from posenc.extend.study.run import run_study

METHODS = "none,string,rerope,leaky_rerope,logn"
LENGTHS = "2k,4k,8k"
TASKS = ("niah_single_2",)
OUT = "benchmarks/studies/smollm2-135m-window"


def config(methods: str, length: str) -> StudyConfig:
    """The study's cells of ``methods`` at ``length`` (every method set for the same target)."""
    return StudyConfig(
        methods=tuple(parse_methods(methods)),
        lengths=parse_lengths(LENGTHS),
        documents=(),
        tasks=TASKS,
        task_lengths=parse_lengths(length),
        task_depths=(0.1, 0.5, 0.9),
        task_samples=8,
        task_questions=4,
    )


if __name__ == "__main__":
    methods = next((a.removeprefix("--methods=") for a in sys.argv if a.startswith("--methods=")),
                   METHODS)  # fmt: skip
    lengths = start(sys.argv) or ["4k", "8k", "2k"]
    model, tokenizer, source = packaged("smollm2", "bfloat16")
    for length in lengths:
        run_study(model, tokenizer, source, config(methods, length), OUT, dtype="bfloat16")
