"""Every generated block and figure of docs/real-model.md, and the READMEs' short task summary,
from the committed study rows.

The studies run in pieces across sessions (``benchmarks/extend_smollm2_tasks.py``,
``benchmarks/extend_gemma3.py``); after each piece this one command rewrites the page's blocks
(``<!-- extend:NAME -->``) and figures from ``benchmarks/studies/`` so that the page says what the
rows say. tests/test_readme.py fails on a block that differs from its rows. The commands are the
CLI a user runs (``posenc extend report``, ``compare`` and ``summary``), printed before each
runs; the text between the blocks (the analysis) is left to be edited by hand.

    python benchmarks/study_docs.py [--list]
"""

import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = "docs/real-model.md"
STUDIES = "benchmarks/studies"
METHODS = "none,yarn,ntk,linear,self_extend,dual_chunk"

#: what each task block's reproduce line says: the piece script and the CLI it amounts to
GEMMA_TASKS = (
    "python benchmarks/extend_gemma3.py --tasks 8k 16k 32k 64k  # = posenc extend gemma3-270m"
    f" --methods {METHODS} --lengths 4k,8k,16k,32k,64k --documents 0 --dtype bfloat16"
    " --tasks niah_single_2"
    " --task-lengths 8k,16k,32k,64k --task-depths 0.1,0.5,0.9 --samples 2 --threads 1"
    f" --out {STUDIES}/gemma3-270m-tasks, then --tasks niah_multikey_1,vt --task-depths 0.5"
)
SMOLLM2_TASKS = (
    "python benchmarks/extend_smollm2_tasks.py 2k 4k 8k 16k 32k  # = posenc extend smollm2"
    f" --methods {METHODS},string --lengths 2k,4k,8k,16k,32k --documents 0 --tasks niah_single_2"
    " --task-depths 0.1,0.5,0.9 --samples 2 --threads 1 --dtype bfloat16"
    f" --out {STUDIES}/smollm2-135m-bf16, then --tasks niah_multikey_1,vt,cwe --task-depths 0.5"
)
WINDOW = (
    "python benchmarks/extend_smollm2_window.py 4k 8k 2k  # = posenc extend smollm2 --methods"
    " none,string,rerope,leaky_rerope,logn --lengths 2k,4k,8k --documents 0 --tasks niah_single_2"
    " --task-depths 0.1,0.5,0.9 --samples 8 --questions-per-context 4 --threads 1"
    f" --dtype bfloat16 --out {STUDIES}/smollm2-135m-window"
)
SMOLLM2_N8 = (
    "posenc extend smollm2 --methods none,string,rerope,ntk,yarn,self_extend,dual_chunk,linear"
    " --lengths 2k,4k,8k,16k,32k --documents 0 --tasks niah_multikey_1,vt,cwe,niah_single_2"
    " --task-lengths 2k,4k --task-depths 0.5 --samples 8 --questions-per-context 4"
    f" --dtype bfloat16 --threads 2 --out {STUDIES}/smollm2-135m-n8"
)
GEMMA_N8 = (
    "posenc extend gemma3-270m --methods none,string,linear,rerope"
    " --lengths 8k,16k,32k,64k --documents 0 --tasks niah_single_2,niah_multikey_1"
    " --task-lengths 8k,16k,32k --task-depths 0.5 --samples 8 --questions-per-context 4"
    f" --dtype bfloat16 --threads 2 --out {STUDIES}/gemma3-270m-n8"
)
#: the task studies of eight samples a cell at the lengths that decide each effective length
#: (the README's table), then the two-sample ones over every length (the page's full table)
EIGHT = ("smollm2-135m-n8", "gemma3-270m-n8")
TWO = ("smollm2-135m-bf16", "gemma3-270m-tasks")
GEMMA_PPL = (
    f"posenc extend gemma3-270m --methods {METHODS} --lengths 4k,8k,16k,32k,64k --documents 1"
    f" --passkey-lengths 32k,64k --passkey-depths 0.5 --threads 1 --out {STUDIES}/gemma3-270m"
)


def report(folder: str, block: str, *extra: str) -> tuple[str, list[str]]:
    """``posenc extend report`` of one study folder into its block of the page."""
    named = [] if block == "real" else ["--block", block]  # "real" is the CLI's default block
    return block, ["extend", "report", f"{STUDIES}/{folder}", "--readme", PAGE, *named, *extra]


def compare(first: str, second: str, block: str) -> tuple[str, list[str]]:
    """``posenc extend compare`` of two study folders into its block of the page."""
    return block, ["extend", "compare", f"{STUDIES}/{first}", f"{STUDIES}/{second}",
                   "--readme", PAGE, "--block", block]  # fmt: skip


def summary(readme: str, folders: tuple[str, ...], *short: str) -> tuple[str, list[str]]:
    """``posenc extend summary`` of task studies into a page's ``ruler`` block (``--short``:
    the READMEs' table alone, which links the page's full block)."""
    return "ruler", ["extend", "summary", *(f"{STUDIES}/{f}" for f in folders), "--readme",
                     readme, "--block", "ruler", *short]  # fmt: skip


def study_summary(folder: str, block: str) -> tuple[str, list[str]]:
    """``posenc extend summary`` of one study folder into its block of the page (its paired
    test between methods, length by length)."""
    return block, ["extend", "summary", f"{STUDIES}/{folder}", "--readme", PAGE, "--block", block]


#: (block, posenc arguments) in the page's order, then the READMEs' summary
COMMANDS: tuple[tuple[str, list[str]], ...] = (
    report("smollm2-ppl", "real", "--figure", "docs/results/real_smollm2.png"),
    report(
        "smollm2-135m-bf16",
        "smollm2-tasks",
        "--command",
        SMOLLM2_TASKS,
        "--heatmap",
        "docs/results/smollm2_needles.png",
        "--task-figure",
        "docs/results/smollm2_tasks.png",
    ),
    compare("smollm2-135m", "smollm2-135m-bf16", "smollm2-dtype"),
    report("smollm2-135m-window", "smollm2-window", "--command", WINDOW),
    study_summary("smollm2-135m-window", "window-summary"),
    report("smollm2-135m-n8", "smollm2-n8", "--command", SMOLLM2_N8),
    study_summary("smollm2-135m-n8", "smollm2-n8-summary"),
    report("gemma3-270m", "gemma3", "--command", GEMMA_PPL),
    report(
        "gemma3-270m-tasks",
        "gemma3-tasks",
        "--command",
        GEMMA_TASKS,
        "--heatmap",
        "docs/results/gemma3_needles.png",
        "--task-figure",
        "docs/results/gemma3_tasks.png",
    ),
    compare("gemma3-270m-f32-tasks", "gemma3-270m-tasks", "gemma3-dtype"),
    report("gemma3-270m-n8", "gemma3-n8", "--command", GEMMA_N8),
    study_summary("gemma3-270m-n8", "gemma3-n8-summary"),
    summary(PAGE, EIGHT + TWO),
    summary("README.md", EIGHT, "--short"),
    summary("README.zh-CN.md", EIGHT, "--short"),
)


def posenc_command() -> list[str]:
    """The ``posenc`` CLI of the interpreter running this script (its venv's, not PATH's)."""
    return [sys.executable, "-m", "posenc"]


def main(argv: list[str]) -> int:
    listing = "--list" in argv
    unknown = [a for a in argv if a != "--list"]
    if unknown:
        print(
            f"unknown arguments {unknown}; usage: python benchmarks/study_docs.py [--list]",
            file=sys.stderr,
        )
        return 2
    for block, args in COMMANDS:
        print(f"[{block}] posenc {shlex.join(args)}", flush=True)
        if not listing:
            subprocess.run(posenc_command() + args, cwd=ROOT, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
