"""The measures stage: what a study reads off a model with a method in place.

:mod:`.perplexity`: loss at every position of a long document (the head only where needed),
perplexity by length, passkey prompts and their scores. :mod:`.longppl`: key-token perplexity
(LongPPL). :mod:`.tasks`: RULER-style tasks built offline with the model's tokenizer, answered
greedily through the KV cache, scored as RULER scores, with effective lengths.

May import: :mod:`.methods <posenc.extend.methods>` and :mod:`.model <posenc.extend.model>`,
:mod:`posenc.hf`, :mod:`posenc.runs`; never the study or a report. A new measure is a file here
(or a task in :mod:`.tasks`), and a cell kind in :mod:`posenc.extend.study`.
"""
