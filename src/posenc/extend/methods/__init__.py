"""The methods stage: what is done to a model to read past (or within) its trained length.

:mod:`.names` parses ``--methods`` (``name:key=value``) and resolves a method for a model: the
RoPE scalings per layer type (:mod:`posenc.hf.scaling`) and the attention extensions. The
extensions are attention over disjoint key sets, each with its own positions, merged by their
log-sum-exp: :mod:`.explicit` is the reference (the papers' rules, block by block),
:mod:`.fused` the fast path (fused kernel calls merged by :mod:`.merge`), :mod:`.flex` the
FlexAttention path for CUDA. :mod:`.export` writes a model folder with the chosen scaling;
:mod:`.finetune` is a short PoSE fine-tune.

May import: :mod:`.model <posenc.extend.model>`, :mod:`posenc.hf`, :mod:`posenc.kernels`,
:mod:`posenc.functional`, :mod:`posenc.rotary`, :mod:`posenc.runs`. :mod:`posenc.hf` imports
:mod:`.fused`, so nothing here imports a measure, the study or a report. A new method is a key
set (or a scaling) here and its name in :mod:`.names`.
"""
