"""The methods stage: what is done to a model to read past (or within) its trained length.

:mod:`.names` parses ``--methods`` (``name:key=value``) and resolves a method for a model: the
RoPE scalings per layer type (:mod:`posenc.hf.scaling`) and the attention extensions. The
extensions are attention over disjoint key sets, each with its own positions, merged by their
log-sum-exp: :mod:`.keysets` defines each method's sets (Self-Extend, Dual Chunk Attention,
STRING, ReRoPE, Leaky ReRoPE, log n) and their defaults; :mod:`.explicit` is the reference
(every definition, block by block),
:mod:`.fused` the fast path (fused kernel calls merged by :mod:`.merge`), :mod:`.flex` the
FlexAttention path for CUDA. :mod:`.export` writes a model folder with the chosen scaling;
:mod:`.finetune` is a short PoSE fine-tune.

May import: :mod:`.model <posenc.extend.model>`, :mod:`posenc.hf`, :mod:`posenc.kernels`,
:mod:`posenc.functional`, :mod:`posenc.rotary`, :mod:`posenc.runs`. :mod:`posenc.hf` imports
:mod:`.fused`, so nothing here imports a measure, the study or a report. A new method is a
definition of key sets in :mod:`.keysets` (or a scaling), its options in
:data:`posenc.hf.extension.EXTENSION_METHODS`.
"""
