"""The SmolLM2-135M task study (docs/real-model.md, block ``extend:smollm2-tasks``): RULER-style
tasks from 2k to 32k tokens, four times the model's trained 8k, under every method; the cells of

    posenc extend smollm2 --methods none,yarn,ntk,linear,self_extend,dual_chunk \\
        --lengths 2k,4k,8k,16k,32k --documents 0 --tasks niah_single_2 --task-depths 0.1,0.5,0.9 \\
        --samples 2 --threads 1 --dtype bfloat16 --out benchmarks/studies/smollm2-135m-bf16
    posenc extend smollm2 ... --tasks niah_multikey_1,vt,cwe --task-depths 0.5 ...

(the needle at three depths for the heatmap, the other tasks at half depth), in bfloat16 as
RULER runs its models (vLLM's dtype; 3.0-3.1x faster than float32 on this CPU with AMX, benchmarks/extend_dtype.py). The same
cells in float32 (``--float32``, folder ``benchmarks/studies/smollm2-135m``, 2k-8k) are the
check that the dtype does not decide the answers (``posenc extend compare``). Run in
pieces: each call answers the task cells at the lengths named on its command line
(default: all of them, shortest first) and skips every cell already in the folder, so a study
longer than a session resumes from the committed rows (``benchmarks/studies/smollm2-135m-bf16/``;
the prompts are rebuilt from the seed, identically, where ``prompts/`` was not kept). The
methods' factors are set for 32k (the longest length) in every piece. ``--ppl`` adds the
perplexity cells (one forward of 32k per method). Then

    posenc extend report benchmarks/studies/smollm2-135m-bf16 --readme docs/real-model.md \\
        --block smollm2-tasks --heatmap docs/results/smollm2_needles.png

writes the block and the heatmap from the rows (``python benchmarks/study_docs.py``: every
block and figure of the page, this one included).

    python benchmarks/extend_smollm2_tasks.py [LENGTH ...] [--ppl] [--float32] [--threads=N]
"""

import sys

from study_args import packaged, run_pieces, start  # benchmarks/, beside this script

from posenc.extend.measures.perplexity import default_documents
from posenc.extend.methods.names import parse_methods
from posenc.extend.study.config import StudyConfig, parse_lengths

#: STRING joined after the others: its cells at 2k-8k (inside the window, where it acts) first
METHODS = "none,yarn,ntk,linear,self_extend,dual_chunk,string"
LENGTHS = "2k,4k,8k,16k,32k"
#: (tasks, their depths): the heatmap's needle at three depths, the others at one
TASKS = ((("niah_single_2",), (0.1, 0.5, 0.9)), (("niah_multikey_1", "vt", "cwe"), (0.5,)))
OUT = "benchmarks/studies/smollm2-135m-bf16"
#: the float32 check's folder: the same cells, the first study's dtype
OUT_FLOAT32 = "benchmarks/studies/smollm2-135m"


def configs(task_lengths: str, ppl: bool) -> list[StudyConfig]:
    """The study's two settings (:data:`TASKS`), answering tasks at ``task_lengths`` only."""
    return [
        StudyConfig(
            methods=tuple(parse_methods(METHODS)),
            lengths=parse_lengths(LENGTHS),
            documents=tuple(str(p) for p in default_documents(1)) if ppl else (),
            tasks=tasks,
            task_lengths=parse_lengths(task_lengths),
            task_depths=depths,
            task_samples=2,
        )
        for tasks, depths in TASKS
    ]


if __name__ == "__main__":
    args = start(sys.argv)
    dtype, out = ("float32", OUT_FLOAT32) if "--float32" in sys.argv else ("bfloat16", OUT)
    ppl = "--ppl" in sys.argv
    lengths = ",".join(args) or LENGTHS
    run_pieces(packaged("smollm2", dtype), lengths, lambda n: configs(n, ppl), out, dtype)
