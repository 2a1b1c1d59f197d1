"""The SmolLM2-135M long-context study (the block of docs/real-model.md): the same cells as

    posenc extend SmolLM2 --methods none,yarn,self_extend,dual_chunk,linear,ntk,dynamic,llama3,longrope \
        --lengths 2k,4k,6k,8k,10k,12k --documents 1 --passkey-lengths 12k --passkey-depths 0.1 \
        --passkey-methods none,yarn,self_extend,dual_chunk --out runs/extend-smollm2

run from Python (resumable: a rerun skips finished cells).
"""

import logging
import sys

import torch

from posenc.extend.measures.perplexity import default_documents
from posenc.extend.methods.names import parse_methods
from posenc.extend.model.load import load_model, resolve_source, smollm2_gguf
from posenc.extend.study.config import StudyConfig, parse_lengths
from posenc.extend.study.run import run_study

METHODS = "none,yarn,self_extend,dual_chunk,linear,ntk,dynamic,llama3,longrope"

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    out = sys.argv[1] if len(sys.argv) > 1 else "runs/extend-smollm2"
    source = resolve_source(str(smollm2_gguf()))
    model, tokenizer = load_model(source)
    cfg = StudyConfig(
        methods=tuple(parse_methods(METHODS)),
        lengths=parse_lengths("2k,4k,6k,8k,10k,12k"),
        documents=tuple(str(p) for p in default_documents(1)),
        passkey_lengths=parse_lengths("12k"),
        passkey_depths=(0.1,),
        passkey_methods=("none", "yarn", "self_extend", "dual_chunk"),
    )
    print("threads", torch.get_num_threads(), flush=True)
    run_study(model, tokenizer, source, cfg, out)
