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

writes the block from the rows.

    python benchmarks/extend_gemma3.py [METHOD ...] [--passkey]
"""

import logging
import sys

import torch

from posenc.extend.evaluate import default_documents
from posenc.extend.methods import parse_methods
from posenc.extend.model import load_model, resolve_source
from posenc.extend.packaged import packaged_gguf
from posenc.extend.study import StudyConfig, parse_lengths, run_study

METHODS = "none,yarn,ntk,linear,self_extend,dual_chunk"
OUT = "benchmarks/studies/gemma3-270m"

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    chosen = ",".join(args) or METHODS
    torch.set_num_threads(1)  # as the committed rows were measured (the other core stays free)
    source = resolve_source(str(packaged_gguf("gemma3-270m")))
    model, tokenizer = load_model(source)
    cfg = StudyConfig(
        methods=tuple(parse_methods(chosen)),
        lengths=parse_lengths("4k,8k,16k,32k,64k"),
        documents=tuple(str(p) for p in default_documents(1)),
        passkey_lengths=parse_lengths("32k,64k") if "--passkey" in sys.argv else (),
        passkey_depths=(0.5,),
    )
    run_study(model, tokenizer, source, cfg, OUT)
