"""The Gemma-3-270M long-context study (docs/real-model.md, block ``extend:gemma3``): the cells of

    posenc extend gemma3-270m --methods none,yarn,ntk,linear,self_extend,dual_chunk \\
        --lengths 4k,8k,16k,32k,64k --documents 1 --passkey-lengths 32k,64k \\
        --passkey-depths 0.5 --threads 1 --out benchmarks/studies/gemma3-270m

run in pieces: each call runs the methods named on its command line (default: all of them, in
that order), perplexity first, and skips every cell already in the folder, so a study longer
than a session resumes from the committed rows (``benchmarks/studies/gemma3-270m/``). The
model is trained at 32,768 tokens: the scalings' factor is 2 (set for 64k), and one forward of
65,536 tokens per method gives the perplexity at every length. Then

    posenc extend report benchmarks/studies/gemma3-270m --readme docs/real-model.md --block gemma3

writes the block from the rows. The task cells (``--tasks LENGTH ...``: RULER-style tasks at
those lengths, shortest first, every method; the needle at three depths for the heatmap, the
others at half depth, two samples each) run in bfloat16, as RULER runs its models (vLLM's
dtype; 3.0x faster than float32 on this CPU with AMX, benchmarks/extend_dtype.py), in their own folder
(``benchmarks/studies/gemma3-270m-tasks/``, block ``extend:gemma3-tasks``):

    posenc extend gemma3-270m --methods ... --lengths 4k,8k,16k,32k,64k --documents 0 \\
        --dtype bfloat16 --tasks niah_single_2 --task-lengths 8k,16k,32k,64k --task-depths 0.1,0.5,0.9 \\
        --samples 2 --threads 1 --out benchmarks/studies/gemma3-270m-tasks
    posenc extend gemma3-270m ... --tasks niah_multikey_1,vt --task-depths 0.5 ...

The first task cells, at 8k in float32, stay in ``benchmarks/studies/gemma3-270m-f32-tasks/``:
the check that the dtype does not decide the answers (``posenc extend compare``). After a
piece, ``python benchmarks/study_docs.py`` rewrites every block and figure of the page.

    python benchmarks/extend_gemma3.py [METHOD ...] [--passkey]
    python benchmarks/extend_gemma3.py --tasks [LENGTH ...] [--threads=N]
"""

import sys

from study_args import packaged, run_pieces, start  # benchmarks/, beside this script

from posenc.extend.measures.perplexity import default_documents
from posenc.extend.methods.names import parse_methods
from posenc.extend.study.config import StudyConfig, parse_lengths
from posenc.extend.study.run import run_study

METHODS = "none,yarn,ntk,linear,self_extend,dual_chunk"
OUT = "benchmarks/studies/gemma3-270m"
TASK_OUT = "benchmarks/studies/gemma3-270m-tasks"

TASK_LENGTHS = "8k,16k,32k,64k"
#: (tasks, their depths): the heatmap's needle at three depths, the others at one
TASKS = ((("niah_single_2",), (0.1, 0.5, 0.9)), (("niah_multikey_1", "vt"), (0.5,)))


def study_config(methods: str, passkey: bool = False, tasks: tuple[str, ...] = (),
                 task_lengths: str = "", depths: tuple[float, ...] = (0.5,)) -> StudyConfig:  # fmt: skip
    """The study's settings: every piece measures with these (the target is 64k in each)."""
    return StudyConfig(
        methods=tuple(parse_methods(methods)),
        lengths=parse_lengths("4k,8k,16k,32k,64k"),
        documents=() if tasks else tuple(str(p) for p in default_documents(1)),
        passkey_lengths=parse_lengths("32k,64k") if passkey else (),
        passkey_depths=(0.5,),
        tasks=tasks,
        task_lengths=parse_lengths(task_lengths) if tasks else (),
        task_depths=depths,
        task_samples=2,
    )


def task_configs(task_lengths: str) -> list[StudyConfig]:
    """The task settings (:data:`TASKS`), answering tasks at ``task_lengths`` only."""
    return [
        study_config(METHODS, tasks=tasks, task_lengths=task_lengths, depths=depths)
        for tasks, depths in TASKS
    ]


if __name__ == "__main__":
    args = start(sys.argv)
    if "--tasks" in sys.argv:  # the task cells at the lengths named, shortest first
        lengths = ",".join(args) or TASK_LENGTHS
        run_pieces(packaged("gemma3-270m", "bfloat16"), lengths, task_configs, TASK_OUT, "bfloat16")
    else:
        model, tokenizer, source = packaged("gemma3-270m")
        cfg = study_config(",".join(args) or METHODS, passkey="--passkey" in sys.argv)
        run_study(model, tokenizer, source, cfg, OUT)
