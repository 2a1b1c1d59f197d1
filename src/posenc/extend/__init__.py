"""Long-context evaluation and extension of a user's real transformers model.

* :mod:`.attention`: Self-Extend and Dual Chunk Attention as attention over disjoint key sets
  (pure tensor functions; :func:`posenc.hf.apply_posenc` puts them into a model with
  ``extension=``).
* :mod:`.methods`: the methods by name (``none``, every RoPE scaling, ``self_extend``,
  ``dual_chunk``) with their options, as ``posenc extend --methods`` reads them.
* :mod:`.model`: loading a model folder, GGUF file or cached model id (never the network).
* :mod:`.evaluate`: loss by position, perplexity by length, passkey retrieval by depth.
* :mod:`.study`: the grid of (method, document or passkey trial) cells, rows resumable.
* :mod:`.export`: a model folder with the chosen scaling that stock transformers loads.

Submodules are imported where used (``from posenc.extend.study import run_study``): this
package sits above :mod:`posenc.hf`, which imports :mod:`.attention`.
"""
