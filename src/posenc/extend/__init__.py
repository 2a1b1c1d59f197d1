"""Long-context evaluation and extension of a user's real transformers model, by stage.

A study walks through the stages in this order, and each stage is one folder:

* :mod:`.model`: the user's model, loaded from a folder, a GGUF file, a cached model id or a
  packaged name (never the network, never a folder's own code).
* :mod:`.methods`: what is done to the model: the methods by name (``none``, every RoPE scaling,
  ``self_extend``, ``dual_chunk``, ``string``, ``rerope``, ``leaky_rerope``, ``logn``) and their
  options; the attention methods as definitions of disjoint key sets (explicit reference, fused,
  FlexAttention, their merge); export to a folder stock transformers loads; a PoSE fine-tune.
* :mod:`.measures`: what is measured on the model with a method in place: loss by position,
  perplexity and passkeys, RULER-style tasks (:mod:`.measures.tasks`), LongPPL.
* :mod:`.study`: the grid of cells, its results folder and rows, the cost estimate and dry run,
  the command that runs a study, the export of a study's chosen method.
* :mod:`.reports`: the rows as tables, Markdown, a summary over studies, paired comparisons
  and figures; nothing here computes what the rows do not hold.

:mod:`.cli` only parses ``posenc extend`` and hands over to the stage that does the work.

Imports go down this list, never up: ``model`` imports no other stage; ``methods`` may import
``model``; ``measures`` may import ``methods`` and ``model``; ``study`` any stage before it;
``reports`` the study's rows and the measures' scoring. Nothing in ``extend`` imports
:mod:`posenc.lab` (what both need, such as checkpoints, is in :mod:`posenc.runs`).
Submodules are imported where used (``from posenc.extend.study.run import run_study``):
:mod:`posenc.hf` imports :mod:`.methods.fused`, so no package here imports anything on import.
"""
