"""transformers-shaped RoPE pieces: a rotary module and apply functions with its interfaces.

For people who wire posenc into a model themselves, in the shapes transformers uses:

* :class:`HFRotaryEmbedding`: ``forward(x, position_ids[, layer_type]) -> (cos, sin)``, the
  interface of every ``*RotaryEmbedding`` class of transformers, exact to the model's own class
  (cos/sin within 1e-6 in float32, bit for bit in bfloat16), with any posenc scaling in place
  of the config's; dynamic NTK keeps transformers' history of the longest length.
* :func:`apply_rotary_pos_emb`: transformers' ``apply_rotary_pos_emb(q, k, cos, sin,
  unsqueeze_dim=1)``, computed by posenc's fused kernel in one pass over q and k.
* :func:`apply_rotary_trailing`: DeepSeek-V4's ``apply_rotary_pos_emb(x, cos, sin)``, one
  tensor rotated on its trailing channels (heads laid out ``[nope | rope]``).
* :func:`apply_rotary_emb`: one tensor, with the argument names of PyTorch's proposed
  ``F.rotary_embedding(x, cos, sin, position_ids=None, *, interleaved=False)``.

Table layouts (``table_layout``) of the cos/sin a caller holds, for ``n = r / 2`` frequencies:

* ``"cat"``: transformers' default, ``cat(freqs, freqs)``: ``[f0 f1 .. f(n-1) f0 f1 .. f(n-1)]``
  (Llama, Qwen, Gemma, GLM, DeepSeek, ...), last dim ``r``;
* ``"repeat"``: ``repeat_interleave(freqs, 2)``: ``[f0 f0 f1 f1 ..]`` (Cohere, Cohere2), last dim
  ``r``;
* ``"half"``: one column per pair, ``[f0 f1 .. f(n-1)]`` (flash-attn, PyTorch's proposal), last
  dim ``n``.

The pairing is separate (``interleaved``): ``False`` rotates ``(x[i], x[i + r/2])`` (NeoX/LLaMA),
``True`` rotates ``(x[2i], x[2i+1])`` (GPT-J, GLM, Cohere). Channels ``r..d-1`` pass through
(partial rotary: GPT-NeoX, Phi, StableLM, GLM). The rotation is computed in float32 whatever the
dtype of x and of the tables; the result has x's dtype.

Shapes: ``b`` batch, ``h`` query heads, ``hk`` key heads, ``s`` sequence, ``d`` head_dim,
``r`` rotary dim, ``n = r / 2``, ``N`` table rows.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .._checks import check_choice, check_positions, host_readable
from ..functional.rope_scaling import ROPE_SCALING
from ..functional.rotary import mrope_cos_sin
from ..kernels import rope_qk
from ..kernels.canonical import call_key
from ..kernels.rope_op import DirectPlan, Plans, lookup, plan_of, remember
from ..rotary import MRoPE, RotaryEmbedding
from ..rotary.embedding import max_position
from .architectures import FLOAT64_ANGLE_MODEL_TYPES
from .checks import check_scaling_argument
from .config import (
    _MODULE_KEYS,
    HF_ROPE_TYPES,
    _get,
    _standardize,
    read_config,
    rope_kwargs,
    rope_module,
)
from .load import resolve_config
from .scaling import scaling_by_layer_type

TABLE_LAYOUTS = ("cat", "repeat", "half")


def half_tables(
    cos: torch.Tensor, sin: torch.Tensor, table_layout: str = "cat"
) -> tuple[torch.Tensor, torch.Tensor]:
    """One column per rotated pair: ``[..., r]`` (``"cat"``/``"repeat"``) or ``[..., n]``
    (``"half"``) -> float32 ``[..., n]`` views where the input is float32 (no copy)."""
    check_choice("table_layout", table_layout, TABLE_LAYOUTS)
    if not isinstance(cos, torch.Tensor) or not isinstance(sin, torch.Tensor):
        raise TypeError(
            f"cos and sin must be tensors, got {type(cos).__name__}, {type(sin).__name__}"
        )
    if cos.shape != sin.shape:
        raise ValueError(
            f"cos and sin must have one shape, got {list(cos.shape)} and {list(sin.shape)}"
        )
    if cos.dim() < 1 or (table_layout != "half" and cos.shape[-1] % 2):
        raise ValueError(
            f"{table_layout!r} tables need an even last dim (2 columns per pair), got {list(cos.shape)}"
        )
    if table_layout == "cat":  # [f0 .. f(n-1) f0 .. f(n-1)] -> [f0 .. f(n-1)]
        n = cos.shape[-1] // 2
        cos, sin = cos[..., :n], sin[..., :n]
    elif table_layout == "repeat":  # [f0 f0 f1 f1 ..] -> [f0 f1 ..]
        cos, sin = cos[..., ::2], sin[..., ::2]
    return cos.float(), sin.float()


def _as_rows(t: torch.Tensor, name: str) -> torch.Tensor:
    """Per-token tables ``[s, n]``, ``[b, s, n]`` or transformers' unsqueezed ``[b, 1, s, n]``
    as the kernels' ``[1 or b, s, n]``."""
    if t.dim() == 4 and t.shape[1] == 1:
        t = t[:, 0]  # [b, s, n]
    if t.dim() == 2:
        t = t[None]  # [1, s, n]
    if t.dim() != 3:
        raise ValueError(
            f"{name} must be [s, w], [b, s, w] or [b, 1, s, w] (w: table columns), got "
            f"{list(t.shape)}"
        )
    return t


def apply_rotary_pos_emb(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    unsqueeze_dim: int = 1,
    *,
    interleaved: bool = False,
    table_layout: str = "cat",
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' ``apply_rotary_pos_emb``, fused: rotate q and k by per-token cos/sin.

    Shapes:
        q: ``[b, h, s, d]`` (``unsqueeze_dim=1``, transformers' default) or ``[b, s, h, d]``
            (``unsqueeze_dim=2``).
        k: the same form with ``hk`` heads and the same ``s``.
        cos, sin: what a transformers rotary module returns, ``[b or 1, s, w]`` (or ``[s, w]``),
            ``w = r`` for ``"cat"``/``"repeat"`` tables and ``n`` for ``"half"``; any float dtype.

    Returns new ``(q', k')`` in the input forms and dtypes; channels ``r..d-1`` pass through.

    >>> import torch
    >>> from posenc.hf import apply_rotary_pos_emb
    >>> angle = torch.arange(3.0)[:, None] * torch.tensor([1.0, 0.1])  # [s, n]
    >>> cos, sin = torch.cat([angle, angle], -1).cos(), torch.cat([angle, angle], -1).sin()
    >>> q, k = apply_rotary_pos_emb(torch.ones(1, 2, 3, 4), torch.ones(1, 1, 3, 4), cos[None], sin[None])
    >>> q.shape, k.shape
    (torch.Size([1, 2, 3, 4]), torch.Size([1, 1, 3, 4]))
    """
    key = None
    if not torch.compiler.is_compiling():
        # A layout seen before passed every check below: run its plan (_DropInPlan).
        options = (unsqueeze_dim, interleaved, table_layout, backend)
        key, plan = lookup(
            _DROP_IN_PLANS, call_key((q, k, cos, sin, None, None, None, None), *options)
        )
        if plan is not None:
            return plan.run(q, k, cos, sin)
    if unsqueeze_dim not in (1, 2):
        raise ValueError(
            f"unsqueeze_dim must be 1 (q [b, h, s, d]) or 2 (q [b, s, h, d]), got {unsqueeze_dim!r}"
        )
    cos_h, sin_h = half_tables(cos, sin, table_layout)
    cos_h, sin_h = _as_rows(cos_h, "cos"), _as_rows(sin_h, "sin")  # [1 or b, s, n]
    r, seq_layout = 2 * cos_h.shape[-1], "bhsd" if unsqueeze_dim == 1 else "bshd"
    layout = "interleaved" if interleaved else "half"
    kernel_options = (r, seq_layout, layout, False, backend)
    out = rope_qk(
        q, k, cos_h, sin_h, layout=layout, rotary_dim=r, seq_layout=seq_layout, backend=backend
    )
    if key is not None:
        direct = plan_of(q, k, cos_h, sin_h, None, None, None, None, options=kernel_options)
        if direct is not None:
            # The kernel reads the first n columns of a float32 "cat" or "half" table as they
            # are (its row stride is the table's); other tables are converted on each call.
            views = cos_h.data_ptr() == cos.data_ptr() and sin_h.data_ptr() == sin.data_ptr()
            remember(_DROP_IN_PLANS, key, _DropInPlan(direct, None if views else table_layout))
    return out


class _DropInPlan:
    """:func:`apply_rotary_pos_emb` for a layout whose checks passed before: the kernel plan
    of :func:`posenc.kernels.rope_qk` (:class:`~posenc.kernels.rope_op.DirectPlan`), and for
    tables the kernel cannot read as they are (``table_layout``: bfloat16, ``"repeat"``) their
    float32 half columns, made once per table pair: the layers of one forward rotate with the
    same cos/sin objects. That memo is checked by identity and by the tensors' version counter
    (an in-place write bumps it); inference tensors, which have none, are converted each call.
    """

    __slots__ = ("direct", "memo", "table_layout")

    def __init__(self, direct: DirectPlan, table_layout: str | None) -> None:
        self.direct, self.table_layout = direct, table_layout
        self.memo: tuple | None = None

    def run(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.table_layout is not None:
            cos, sin = self._half(cos, sin, self.table_layout)
        return self.direct.run(q, k, cos, sin, None, None, None, None)

    def _half(
        self, cos: torch.Tensor, sin: torch.Tensor, table_layout: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        memo = self.memo
        fresh = memo is not None and memo[0]() is cos and memo[1]() is sin
        if fresh and memo[2] == (cos._version, sin._version):  # type: ignore[index]
            return memo[3], memo[4]  # type: ignore[index]
        cos_h, sin_h = half_tables(cos, sin, table_layout)  # float32 [.., n]
        if not (cos.is_inference() or sin.is_inference()):
            versions = (cos._version, sin._version)
            self.memo = (weakref.ref(cos), weakref.ref(sin), versions, cos_h, sin_h)
        return cos_h, sin_h


#: call_key of a drop-in call -> its plan.
_DROP_IN_PLANS: dict[tuple, _DropInPlan] = Plans()


def apply_rotary_emb(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    *,
    interleaved: bool = False,
    table_layout: str = "cat",
    seq_layout: str = "bhsd",
    backend: str = "auto",
) -> torch.Tensor:
    """Rotate one tensor (the names of PyTorch's proposed ``F.rotary_embedding``).

    Shapes:
        x: ``[b, h, s, d]`` (``seq_layout="bhsd"``, SDPA's) or ``[b, s, h, d]`` (``"bshd"``).
        cos, sin: without ``position_ids``, per-token tables ``[b or 1, s, w]`` or ``[s, w]``
            (transformers' rotary output); with ``position_ids``, a table ``[N, w]`` whose rows
            ``position_ids`` selects.
        position_ids: ``[s]`` or ``[b, s]`` integer rows of the table.

    ``w`` is ``r`` for ``table_layout="cat"`` (transformers' default) or ``"repeat"``, ``n`` for
    ``"half"`` (PyTorch's proposal, flash-attn). Returns a new tensor like ``x``.
    """
    cos_h, sin_h = half_tables(cos, sin, table_layout)
    layout = "interleaved" if interleaved else "half"
    empty = x.narrow(1 if seq_layout == "bhsd" else 2, 0, 0)  # a key with no heads: q alone
    if position_ids is None:
        cos_h, sin_h = _as_rows(cos_h, "cos"), _as_rows(sin_h, "sin")
        out, _ = rope_qk(
            x, empty, cos_h, sin_h, layout=layout, seq_layout=seq_layout, backend=backend
        )
        return out
    if cos_h.dim() != 2:
        raise ValueError(
            f"with position_ids, cos and sin must be tables [N, w], got {list(cos.shape)}"
        )
    position_ids = check_positions(position_ids, "position_ids", ranks=(1, 2))
    out, _ = rope_qk(
        x,
        empty,
        cos_h,
        sin_h,
        positions=position_ids,
        layout=layout,
        seq_layout=seq_layout,
        backend=backend,
    )
    return out


def apply_rotary_trailing(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    unsqueeze_dim: int = 1,
    *,
    interleaved: bool = True,
    table_layout: str = "half",
    backend: str = "auto",
) -> torch.Tensor:
    """DeepSeek-V4's ``apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=1)``: rotate the *trailing*
    ``r`` channels of each head (``[nope | rope]``), the leading ``d - r`` pass.

    Shapes: ``x [b, h, s, d]`` (``unsqueeze_dim=1``) or ``[b, s, h, d]`` (``2``); ``cos``,
    ``sin [b or 1, s, w]`` or ``[s, w]``, ``w = r/2`` for ``"half"`` tables (DeepSeek-V4's rotary
    output) and ``r`` for ``"cat"``/``"repeat"``. Called with ``-sin`` it rotates by minus the
    angle, as DeepSeek-V4's attention undoes the values' rotation on its output. The rotation
    is posenc's fused kernel, in float32; returns a new tensor of ``x``'s shape and dtype.
    """
    if unsqueeze_dim not in (1, 2):
        raise ValueError(
            f"unsqueeze_dim must be 1 (x [b, h, s, d]) or 2 (x [b, s, h, d]), got {unsqueeze_dim!r}"
        )
    cos_h, sin_h = half_tables(cos, sin, table_layout)  # [.., r/2]
    r, d = 2 * cos_h.shape[-1], x.shape[-1]
    if r > d:
        raise ValueError(f"the tables rotate {r} channels but x has head_dim {d}: r must be <= d")
    seq_layout = "bhsd" if unsqueeze_dim == 1 else "bshd"
    rope = apply_rotary_emb(
        x[..., d - r :], cos_h, sin_h, interleaved=interleaved, table_layout="half",
        seq_layout=seq_layout, backend=backend,
    )  # fmt: skip
    return torch.cat((x[..., : d - r], rope), dim=-1)  # [.., d]: untouched nope, rotated rope


# --- the rotary module ---------------------------------------------------------------------------


def table_rope_from_hf(
    config: Any, layer_type: str | None = None, *, use_transformers: bool = True
) -> RotaryEmbedding:
    """:func:`rope_from_hf` for its cos/sin tables alone, as a replaced rotary module of a model
    serves them to the model's own (patched) rotation: a type whose rotation posenc's modules do
    not perform (NanoChat's, by minus the angle) is read too."""
    cfg, model_types = read_config(resolve_config(config), use_transformers, tables=True)
    return rope_module(rope_kwargs(cfg, model_types, layer_type))


def _rescaled(own: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """A layer type's rope parameters ``own`` with the scaling ``new`` in place of its own."""
    kept = {k: v for k, v in own.items() if k in _MODULE_KEYS and k not in ("rope_type", "type")}
    orig = "original_max_position_embeddings"
    spec = ROPE_SCALING.get(str(new.get("rope_type", new.get("type"))))
    if (
        own.get("llama_4_scaling_beta")
        and orig in own
        and spec
        and orig in (*spec.required, *spec.optional)
    ):
        # the attention temperature's length stays (Ministral-3): transformers reads one key
        # for it and for a YaRN that gives none
        kept[orig] = own[orig]
    return {**kept, **new}


def with_rope_parameters(text_config: Any, scaling: Mapping[str, Any], layers: str = "auto") -> Any:
    """A copy of a transformers text config whose RoPE scaling is ``scaling``.

    ``scaling`` is a flat dict (``{"rope_type": "yarn", "factor": 4.0, ...}``), applied to the
    layer types :func:`~posenc.hf.scaling.scaling_layer_types` gives for ``layers`` (``"auto"``:
    where transformers puts a flat ``rope_scaling`` for this model type, Gemma-3's
    full-attention layers; ``"all"``: every layer type with RoPE), or a dict keyed by layer type
    (``{"full_attention": {...}}``), applied to the types it names. Each layer type keeps its own ``rope_theta``,
    ``partial_rotary_factor`` and M-RoPE keys; its old scaling keys are replaced. A transformers
    4.x config (``rope_theta``/``rope_scaling``, no ``rope_parameters``) comes back as posenc
    reads it, a dict in 5.x's shape (:func:`~posenc.hf.rope_from_hf` reads it as it is).
    """
    check_scaling_argument(scaling, HF_ROPE_TYPES)
    cfg = copy.deepcopy(text_config)
    legacy = getattr(cfg, "rope_parameters", None) is None and hasattr(cfg, "to_dict")
    if legacy:
        cfg = _standardize(cfg.to_dict())
    scaling = scaling_by_layer_type(cfg, scaling, layers) or {}  # where a flat one goes
    params = copy.deepcopy(dict(_get(cfg, "rope_parameters") or {}))
    labels = set(_get(cfg, "layer_types") or ())
    nested = [k for k, v in params.items() if k in labels or isinstance(v, Mapping)]
    keyed = bool(scaling) and all(isinstance(v, Mapping) for v in scaling.values())

    if not nested:
        if keyed:
            raise ValueError(
                f"scaling is keyed by layer type {sorted(scaling)} but this config has one set "
                "of rope parameters: pass a flat dict ({'rope_type': ..., ...})"
            )
        params = _rescaled(params, scaling)
    elif keyed:
        unknown = sorted(set(scaling) - set(nested))
        if unknown:
            raise ValueError(f"scaling names layer types {unknown}; this config has {nested}")
        for key, new in scaling.items():
            if params[key] is None:
                raise ValueError(f"layer type {key!r} uses no RoPE: it cannot be scaled")
            params[key] = _rescaled(params[key], new)
    else:  # a flat scaling on a per-type config: scaling_by_layer_type keyed it above
        raise AssertionError("unreachable: a flat scaling on per-type rope parameters")
    if legacy:  # filled in as the 5.x class would (Phi-3's config-level original length wins)
        return _standardize({**cfg, "rope_parameters": params, "rope_scaling": None})
    # Rebuilt by the config class, so its own standardization runs as it would for a model built
    # with these parameters (Phi-3's config-level original length wins, defaults are filled).
    if hasattr(cfg, "to_dict") and hasattr(type(cfg), "from_dict"):
        try:
            return type(cfg).from_dict({**cfg.to_dict(), "rope_parameters": params})
        except Exception as e:  # its validation (Phi-3: longrope only), of any class
            raise ValueError(
                f"transformers' {type(cfg).__name__} refuses these rope parameters: "
                f"{' '.join(str(e).split())}"
            ) from None
    cfg.rope_parameters = params
    return cfg


#: Model types whose ``get_rope_index`` gives float32 position ids (Qwen3-Omni, the
#: ``audio_merged`` layout of :func:`posenc.rotary.mrope_position_ids`: a video's frames sit at
#: fractional temporal positions, ``seconds per grid * position_id_per_seconds``); their text
#: configs' rotary takes them as they are.
FRACTIONAL_POSITION_MODEL_TYPES = frozenset(
    {"qwen3_omni_moe", "qwen3_omni_moe_thinker", "qwen3_omni_moe_text", "qwen3_omni_moe_talker",
     "qwen3_omni_moe_talker_text"}
)  # fmt: skip

#: Model types whose rotary class returns float32 cos/sin whatever ``x``'s dtype (their
#: transformers 5.x ``forward`` skips the cast), so their attention rotates in float32.
FLOAT32_TABLE_TYPES = frozenset({"olmo3", "beam", "lfm3"})


class HFRotaryEmbedding(nn.Module):
    """A transformers rotary module computed by posenc: ``forward(x, position_ids) -> (cos, sin)``.

    Args:
        config: a transformers config (or anything :func:`posenc.hf.rope_from_hf` reads).
        scaling: None (the config's own RoPE), or rope parameters replacing the config's
            scaling (see :func:`with_rope_parameters`): context extension.
        table_layout: ``"cat"`` (default: transformers' ``cat(freqs, freqs)``), ``"repeat"``
            (Cohere's ``repeat_interleave``) or ``"half"`` (gpt-oss: one column per pair); see
            the module docstring.
        dtype: the dtype of the returned tables; None (default) returns ``x.dtype`` as
            transformers does, and float32 for the model types whose own class keeps its
            tables in float32 (:data:`FLOAT32_TABLE_TYPES`: OLMo-3, Beam, LFM3).
            The model types whose class takes float64 angles of its float32 frequencies
            (:data:`~posenc.hf.architectures.FLOAT64_ANGLE_MODEL_TYPES`: Ergo) get theirs so.
        layer_type: with per-layer-type parameters, the type of a call that names none
            (transformers 4.x's Gemma-3 has a rotary module per type, called without one).
        scaling_layers: where a flat ``scaling`` goes on a model with rope parameters per layer
            type: ``"auto"`` (transformers' rule: Gemma-3's full-attention layers), ``"full"``
            or ``"all"`` (:mod:`posenc.hf.scaling`).

    Shapes: ``x`` any tensor (its dtype and device are read); ``position_ids [b, s]`` (M-RoPE:
    ``[3, b, s]`` too) -> ``cos, sin [b, s, r]`` (``[b, s, n]`` for ``"half"``). With per-layer-type parameters (Gemma-3,
    OLMo-3) pass ``layer_type`` as those models' own class takes it. Holds no buffers: the
    model's ``state_dict`` is unchanged when it replaces the model's own rotary module.
    """

    def __init__(
        self,
        config: Any,
        scaling: Mapping[str, Any] | None = None,
        *,
        table_layout: str = "cat",
        dtype: torch.dtype | None = None,
        layer_type: str | None = None,
        scaling_layers: str = "auto",
    ) -> None:
        super().__init__()
        check_choice("table_layout", table_layout, TABLE_LAYOUTS)
        text = (
            config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        )
        read: dict[str, Any] = {}
        if scaling is not None:
            text = with_rope_parameters(text, scaling, scaling_layers)
            if isinstance(text, Mapping):  # a 4.x config as posenc reads it: read as it is
                read["use_transformers"] = False
        if not isinstance(text, Mapping):  # attention that reads its rotary's config (Granite-SWA)
            self.config = text
        params = _get(text, "rope_parameters") or {}
        labels = set(_get(text, "layer_types") or ())
        self.layer_types = tuple(
            k
            for k, v in params.items()
            if (k in labels or isinstance(v, Mapping)) and v is not None
        )
        # Plain attributes, not submodules: the posenc modules keep their frequencies on the CPU
        # (module.to(bfloat16) must not round them) and have no state to save.
        if self.layer_types:
            self.ropes = {t: table_rope_from_hf(text, t, **read) for t in self.layer_types}
        else:
            self.ropes = {None: table_rope_from_hf(text, **read)}
        self.layer_type = layer_type if layer_type in self.ropes else None
        # transformers' attribute, which some models read (Ergo iterates it for the layer types
        # with RoPE): a rope type per layer type, or the one rope type
        self.rope_type: dict[str, str] | str = (
            {t: _rope_type_of(params[t]) for t in self.layer_types}
            if self.layer_types
            else _rope_type_of(params)
        )
        if dtype is None and _get(text, "model_type") in FLOAT32_TABLE_TYPES:
            dtype = torch.float32
        self.table_layout, self.dtype = table_layout, dtype
        self.fractional = _get(text, "model_type") in FRACTIONAL_POSITION_MODEL_TYPES
        self.float64_angles = _get(text, "model_type") in FLOAT64_ANGLE_MODEL_TYPES
        # Dynamic NTK as transformers keeps it: the longest length seen since the last call
        # within the original length (its ``max_seq_len_cached``), per layer type.
        self.dynamic_len: dict[str | None, int] = {}

    def rope(self, layer_type: str | None = None) -> RotaryEmbedding:
        """The posenc rotary module of ``layer_type`` (None where the config has one)."""
        layer_type = self.layer_type if layer_type is None else layer_type
        if layer_type is None and len(self.ropes) == 1:
            return next(iter(self.ropes.values()))
        if layer_type not in self.ropes:
            raise ValueError(
                f"layer_type must be one of {list(self.layer_types)} for this config, got "
                f"{layer_type!r}"
            )
        return self.ropes[layer_type]

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [*]``, ``position_ids [b, s]`` (M-RoPE ``[3, b, s]``; float32 for the types of
        :data:`FRACTIONAL_POSITION_MODEL_TYPES`) -> ``cos, sin [b, s, r]``."""
        rope = self.rope(layer_type)
        if isinstance(rope, MRoPE):
            cos, sin = _mrope_cos_sin(rope, position_ids, self.fractional)  # [b, s, n]
        else:
            positions = check_positions(position_ids, "position_ids", ranks=(1, 2))
            seq_len = self._dynamic_length(rope, layer_type, positions)
            if self.float64_angles:
                cos, sin = float64_angle_cos_sin(rope, positions, seq_len)
            else:
                cos, sin = rope.cos_sin(positions, seq_len)
        if self.table_layout == "cat":  # [f0 .. f(n-1)] -> [f0 .. f(n-1) f0 .. f(n-1)]
            cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
        elif self.table_layout == "repeat":  # [f0 f1 ..] -> [f0 f0 f1 f1 ..]
            cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
        dtype = x.dtype if self.dtype is None else self.dtype
        return cos.to(device=x.device, dtype=dtype), sin.to(device=x.device, dtype=dtype)

    def _dynamic_length(
        self, rope: RotaryEmbedding, layer_type: str | None, positions: torch.Tensor
    ) -> int | None:
        """The length dynamic NTK's frequencies are for, with transformers' history: they grow
        with the longest call and fall back only when a call is within the original length.
        Reads the largest position on the host, as transformers' own module does."""
        if rope.rope_type != "dynamic":
            return None
        original = int(rope.scaling["original_max_position_embeddings"])  # type: ignore[index]
        seq_len = max_position(positions) + 1
        cached = self.dynamic_len.get(layer_type, original)
        if seq_len > cached:
            cached = seq_len
        elif seq_len < original:
            cached = original
        self.dynamic_len[layer_type] = cached
        return cached

    def extra_repr(self) -> str:
        return f"ropes={self.ropes}, table_layout={self.table_layout!r}"


def _rope_type_of(params: Any) -> str:
    """transformers' name of one set of rope parameters' type (``"default"`` without one)."""
    name = params.get("rope_type", params.get("type")) if isinstance(params, Mapping) else None
    return str(name or "default")


def float64_angle_cos_sin(
    rope: RotaryEmbedding, positions: torch.Tensor, seq_len: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin [*, n]`` (float64, attention factor included) of integer ``positions [*]``
    from float64 angles of ``rope``'s frequencies as it holds them (float32 for a module of
    :func:`table_rope_from_hf`): Ergo's ``position.double() * inv_freq.double()``. Its cached
    tables are float32 angles, and a float64 ``angle_dtype`` computes the frequencies in
    float64 too; either moves cos/sin by up to 0.05 at 4x Ergo's context. ``seq_len``: as for
    :meth:`~posenc.rotary.RotaryEmbedding.cos_sin` (None: the positions' own length)."""
    if seq_len is None:  # chosen on the positions' device: nothing is read back to the host
        inv_freq, factor = rope._traced_frequencies(positions, positions)
    else:
        inv_freq, factor = rope.frequencies(seq_len)
    inv_freq = inv_freq.to(device=positions.device, dtype=torch.float64)
    angle = positions.to(torch.float64)[..., None] * inv_freq  # [*, n]
    return angle.cos() * factor, angle.sin() * factor


def _mrope_cos_sin(
    rope: MRoPE, position_ids: torch.Tensor, fractional: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """M-RoPE cos/sin ``[b, s, n]`` of ``position_ids [b, s]`` (text) or ``[3, b, s]``; integer,
    or float32 where ``fractional`` (Qwen3-Omni's)."""
    if fractional and isinstance(position_ids, torch.Tensor) and position_ids.is_floating_point():
        if position_ids.dtype != torch.float32 or position_ids.dim() not in (2, 3):
            raise ValueError(
                "fractional position_ids must be float32 [b, s] or [3, b, s] (get_rope_index's), "
                f"got {position_ids.dtype} {list(position_ids.shape)}"
            )
        pos = position_ids
    else:
        pos = check_positions(position_ids, "position_ids", ranks=(2, 3))
    pos3 = pos if pos.dim() == 3 else pos[None].expand(3, *pos.shape)  # [3, b, s]
    if pos3.shape[0] != 3:
        raise ValueError(f"M-RoPE position_ids must be [b, s] or [3, b, s], got {list(pos.shape)}")
    if host_readable(pos3):
        inv_freq, factor = rope.frequencies(max_position(pos3) + 1)
    else:
        inv_freq, factor = rope._traced_frequencies(pos3, pos3)
    return mrope_cos_sin(
        pos3, inv_freq, rope.mrope_section, rope.allocation, factor, fractional=fractional
    )


class ComplexRotaryEmbedding(nn.Module):
    """Llama-4's rotary interface on posenc's tables: ``forward(x, position_ids)`` ->
    ``freqs_cis [b, s, r/2]`` complex64, ``cos + i sin`` of each pair with the attention factor
    folded in, as ``torch.polar(1, angle) * attention_scaling`` gives it (the rotation,
    :data:`~posenc.hf.supported.LLAMA4`, reads its real and imaginary parts)."""

    def __init__(self, tables: HFRotaryEmbedding) -> None:
        super().__init__()
        tables.table_layout, tables.dtype = "half", torch.float32
        self.tables = tables

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        cos, sin = self.tables(x, position_ids)  # [b, s, r/2] float32
        return torch.complex(cos, sin)
