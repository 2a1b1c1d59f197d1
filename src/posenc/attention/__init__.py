"""One multi-head attention for every positional-encoding family.

Layout: :mod:`.module` (the :class:`Attention` layer: project, position context, family hook,
cache, path, output), :mod:`.context` (:class:`PositionContext`, built once per forward),
:mod:`.hooks` (one hook per family, resolved when the layer is built), :mod:`.policy` (the pure
path choice), :mod:`.paths` (SDPA, FlexAttention, explicit), :mod:`.masks`, :mod:`.cache`.

Where position enters (DESIGN.md): an ``encoding`` module declares its ``family``:

* ``"rotary"``: ``encoding.prepare(q, k, ctx) -> (q, k)`` rotates queries and keys before the
  scores (and before keys enter the KV cache) with the per-forward cos/sin of the position
  context ``ctx``; a module with only ``forward(q, k, positions, k_positions)`` is called so.
* ``"bias"``: ``encoding.bias(positions, k_positions) -> [h, s, t]`` or ``[b, h, s, t]``
  (float32) is added to the logits. Content-free, so it can be fused into SDPA's float mask;
  ``encoding.score_mod(positions, k_positions)`` gives the same bias entry by entry as a
  FlexAttention ``score_mod(score, b, h, q_idx, kv_idx)`` (see :mod:`posenc.bias`).
* ``"relative"``: content-dependent schemes give their scaled logits,
  ``encoding.scores(q, k, call) -> [b, h, s, t]`` (and Shaw's value term
  ``encoding.values(probs, call)``); the explicit path owns the mask, the softmax and ``@ v``.
  ``call`` (a :class:`ScoreContext`) holds the positions, the index layout (every key at its
  index, which Transformer-XL's rel-shift needs and nobody has to read position values to
  know), the mask, the scale, and the layer's ``q_proj``/``k_proj`` (DeBERTa's shared keys).
* ``"none"``: nothing happens here. ``"absolute"`` encodings are refused (a ValueError saying
  where they go): they add to the token embeddings before the first layer, as
  :class:`posenc.model.TransformerLM` does, and inside attention they would silently do nothing.

DeepSeek's decoupled RoPE (MLA) splits each head into a rotated and an unrotated part with one
shared rotary key head, and changes the softmax scale under YaRN: the recipe, with
``DecoupledRoPE``, ``expand_shared_key`` and ``mla_softmax_scale``, is in :mod:`posenc.rotary.mla`
(pass its scale as ``Attention(..., scale=mla_softmax_scale(...))``).

Positions are integer ``[s]`` or ``[b, s]`` (Hugging Face ``position_ids``); every family names
the queries' ``positions`` and the keys' ``k_positions``. Causality is by index (query ``i`` of
``s`` sees key ``j`` of ``t`` when ``j <= t - s + i``), so left padding, packing and cache offsets
change positions without changing the mask.

Capture-safe: no forward path reads tensor values back to the host (no ``.item()``, ``.any()``,
``bool(t)``), so a forward traces into one graph under ``torch.compile(fullgraph=True)`` and a
decode step can be captured in a CUDA graph. Value checks (non-negative positions) run only where
they are free (eager CPU) or as device assertions (:func:`posenc._checks.check_values`).

Execution paths (``Attention(backend=...)``):

* ``"sdpa"``: ``F.scaled_dot_product_attention``; a bias family's ``[h, s, t]`` bias is
  materialized and fused into the float mask.
* ``"flex"``: FlexAttention (``torch.nn.attention.flex_attention``), compiled; a bias family adds
  its bias entry by entry in a ``score_mod`` (never materialized) and causality is a block mask
  that skips fully masked blocks. Causal block masks come from a :class:`BlockMaskCache` shared
  by all layers. Forward everywhere; backward on GPU only (PyTorch has no FlexAttention backward
  on CPU), and no dropout.
* ``"explicit"``: ``softmax(q k^T * scale + bias) v`` written out; the only path of the
  content-dependent ``relative`` family (its ``scores``), and a reference for the others.
* ``"auto"`` (default): ``explicit`` for the relative family; for the bias family ``flex`` when
  FlexAttention can run the call (available for the device, no gradient needed on CPU, no
  dropout, float32/16/bf16), the problem is large (``s * t >= FLEX_MIN_SCORES``, where a
  materialized bias costs more than a kernel compile) and the encoding's ``score_mod`` is cheap
  for these positions (Sandwich's is, in the index layout only: ``flex_any_positions``);
  ``sdpa`` otherwise.
"""

from .._constants import DeviceConstants
from ..functional.attention import masked_softmax, repeat_kv
from .cache import KVCache, cat_positions
from .context import PositionContext, ScoreContext, check_seq_positions, position_context
from .hooks import (
    ENCODING_FAMILIES,
    BiasFamily,
    FamilyHook,
    RelativeFamily,
    RotaryFamily,
    encoding_family,
    resolve_hook,
)
from .masks import (
    DEFAULT_BLOCK_MASK_CACHE,
    BlockMaskCache,
    build_mask,
    causal_block_mask,
    flex_block_mask,
)
from .module import Attention, QueryHook
from .paths import explicit_path, flex_attention_fn, flex_path, sdpa_path
from .policy import ATTENTION_BACKENDS, FLEX_MIN_SCORES, choose_backend, flex_available

__all__ = [
    "ATTENTION_BACKENDS",
    "DEFAULT_BLOCK_MASK_CACHE",
    "ENCODING_FAMILIES",
    "FLEX_MIN_SCORES",
    "Attention",
    "BiasFamily",
    "BlockMaskCache",
    "DeviceConstants",
    "FamilyHook",
    "KVCache",
    "PositionContext",
    "QueryHook",
    "RelativeFamily",
    "RotaryFamily",
    "ScoreContext",
    "build_mask",
    "cat_positions",
    "causal_block_mask",
    "check_seq_positions",
    "choose_backend",
    "encoding_family",
    "explicit_path",
    "flex_attention_fn",
    "flex_available",
    "flex_block_mask",
    "flex_path",
    "masked_softmax",
    "position_context",
    "repeat_kv",
    "resolve_hook",
    "sdpa_path",
]
