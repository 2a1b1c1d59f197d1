"""posenc inside lm-evaluation-harness (lm-eval 0.4.13, the ``lmeval`` extra).

* :mod:`.model`: ``--model posenc``, lm-eval's ``HFLM`` with a posenc method applied where
  lm-eval builds the model (``method=yarn:factor=4``, ``method=self_extend:group_size=4``):
  ``accelerate launch`` data parallelism and ``parallelize=True`` as with ``--model hf``; a
  request past the method's ``max_length`` refused, never truncated; loglikelihood from the
  scored positions' logits only.
* :mod:`.launcher` (``python -m posenc.lmeval ...``, ``posenc lm-eval ...``): registers the
  model and hands the command line to lm-eval's own CLI (lm-eval 0.4.13 discovers no models
  from installed packages).
* :mod:`.taskdir`: posenc's offline tasks as an lm-eval task folder.

Nothing here imports lm-eval on import: ``import posenc.lmeval.model`` does (and registers the
model), so posenc without the extra is unchanged. May import :mod:`posenc.extend` (the methods,
the model loader) and :mod:`posenc.hf`; nothing in posenc imports this package but the CLI.
"""

from __future__ import annotations


def register() -> None:
    """Register ``posenc`` among lm-eval's models (importing :mod:`.model` does it; calling this
    twice is harmless): what a Python caller of ``lm_eval.simple_evaluate`` does first."""
    from . import model  # noqa: F401
