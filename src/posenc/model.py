"""A small pre-norm decoder-only language model for the lab, with the encoding chosen by name.

Two Llama-4 options, both off by default (the model, its weights and the lab's results are then
what they were before the options existed):

* ``nope_every = n``: every ``n``-th layer (1-based: layer ``i`` with ``(i + 1) % n == 0``) has no
  position encoding, as transformers' ``Llama4TextConfig.no_rope_layers`` (built from
  ``no_rope_layer_interval``: ``int((i + 1) % n != 0)``, 1 = uses RoPE). :func:`nope_layers`.
* ``temperature``: a :class:`~posenc.rotary.temperature.QueryTemperature` scaling the queries of
  the layers in its ``layers`` (None: every layer) after any rotation, before the scores, as
  ``Llama4TextAttention`` does on its NoPE layers (``attn_temperature_tuning and not use_rope``).
  Llama-4's kind (``"llama4_temperature"``) is evaluated at each query's index in the KV cache
  (``past + arange(s)``, whatever the positions), Ministral-3's (``"llama4_scaling"``) at the
  queries' positions. For Llama-4, pass ``layers=nope_layers(num_layers, nope_every)``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import registry
from ._checks import check_positive_int
from ._context import PositionContext
from .attention import Attention, KVCache, position_context
from .deferred import reset_submodules
from .rotary.temperature import QueryTemperature


def nope_layers(num_layers: int, nope_every: int | None) -> tuple[int, ...]:
    """The 0-based layers without position encoding: ``i`` with ``(i + 1) % nope_every == 0``.

    Llama-4's convention (``no_rope_layers[i] = int((i + 1) % no_rope_layer_interval != 0)``):
    with ``nope_every = 4`` layers 3, 7, 11, ... are NoPE. None: no such layer.
    """
    if nope_every is None:
        return ()
    check_positive_int("nope_every", nope_every)
    return tuple(i for i in range(num_layers) if (i + 1) % nope_every == 0)


@dataclass
class ModelConfig:
    """Shape of a :class:`TransformerLM`. ``max_len`` is the training length (learned tables are
    sized to it); ``encoding``/``encoding_kwargs`` go to :func:`posenc.registry.build`."""

    vocab_size: int = 256
    dim: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int | None = None
    max_len: int = 256
    mlp_ratio: float = 4.0
    causal: bool = True
    dropout: float = 0.0
    encoding: str = "rope"
    encoding_kwargs: dict[str, Any] = field(default_factory=dict)
    nope_every: int | None = None
    temperature: QueryTemperature | None = None

    def __post_init__(self) -> None:
        if self.nope_every is not None:
            check_positive_int("nope_every", self.nope_every)
        t = self.temperature
        if isinstance(t, dict):  # read back from to_dict / JSON
            layers = t.get("layers")
            t = QueryTemperature(**{**t, "layers": None if layers is None else tuple(layers)})
            self.temperature = t
        if t is not None and not isinstance(t, QueryTemperature):
            raise TypeError(
                f"temperature must be a QueryTemperature (or its dict) or None, got {t!r:.80}"
            )
        bad = [i for i in (t.layers or ()) if not 0 <= i < self.num_layers] if t else []
        if bad:
            raise ValueError(
                f"temperature.layers must be layer indices in [0, {self.num_layers}), got {bad}"
            )

    def to_dict(self) -> dict[str, Any]:
        """Every field, as plain data (``ModelConfig(**cfg.to_dict())`` round-trips)."""
        return asdict(self)


class TemperedAttention(Attention):
    """:class:`~posenc.attention.Attention` with a
    :class:`~posenc.rotary.temperature.QueryTemperature` as its query hook
    (:meth:`~posenc.rotary.temperature.QueryTemperature.scale_queries`): queries scaled after
    any rotation, before the scores. Shapes as Attention's."""

    def __init__(self, *args: Any, temperature: QueryTemperature, **kwargs: Any) -> None:
        super().__init__(*args, query_hook=temperature.scale_queries, **kwargs)
        self.temperature = temperature

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, temperature={self.temperature}"


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.down(F.gelu(self.up(x))))


class Block(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        encoding: nn.Module | None,
        temperature: QueryTemperature | None = None,
    ) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.dim)
        kw: dict[str, Any] = {"causal": cfg.causal, "encoding": encoding, "dropout": cfg.dropout}
        if temperature is None:
            self.attn = Attention(cfg.dim, cfg.num_heads, cfg.num_kv_heads, **kw)
        else:
            self.attn = TemperedAttention(
                cfg.dim, cfg.num_heads, cfg.num_kv_heads, temperature=temperature, **kw
            )
        self.norm2 = nn.RMSNorm(cfg.dim)
        self.mlp = MLP(cfg.dim, int(cfg.dim * cfg.mlp_ratio), cfg.dropout)

    def forward(
        self,
        x: torch.Tensor,
        context: PositionContext,
        cache: KVCache | None,
        attn_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Shapes: ``x [b, s, dim]`` -> ``[b, s, dim]``; ``context``: the forward's positions."""
        x = x + self.attn(self.norm1(x), cache=cache, attn_mask=attn_mask, context=context)
        return x + self.mlp(self.norm2(x))


class TransformerLM(nn.Module):
    """Token embedding, optional absolute encoding, ``num_layers`` pre-norm blocks, tied head.

    Encodings that act inside attention are built once and shared by every layer when the
    registry marks them ``shared`` (RoPE, ALiBi, T5's bias), else once per layer; the layers of
    ``cfg.nope_every`` get none, and those of ``cfg.temperature`` scale their queries (module
    docstring).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        entry = registry.entry(cfg.encoding)
        self.family = entry.family

        def make() -> nn.Module:
            return registry.build(
                cfg.encoding,
                dim=cfg.dim,
                num_heads=cfg.num_heads,
                max_len=cfg.max_len,
                causal=cfg.causal,
                **cfg.encoding_kwargs,
            )

        if cfg.nope_every is not None and entry.family == "absolute":
            raise ValueError(
                f"nope_every removes the encoding from some attention layers, but {cfg.encoding!r} "
                "is absolute (added once to the token embeddings): use a rotary, bias or "
                "relative encoding, or nope_every=None"
            )
        self.nope_layers = nope_layers(cfg.num_layers, cfg.nope_every)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.absolute: nn.Module | None = make() if entry.family == "absolute" else None
        inner = entry.family in ("rotary", "bias", "relative")
        some = cfg.nope_every is None or len(self.nope_layers) < cfg.num_layers
        shared = make() if inner and entry.shared and some else None

        def layer_encoding(i: int) -> nn.Module | None:
            # Called once per layer, right before the layer is built: the order in which
            # parameters draw from the RNG is the one before nope_every existed.
            if not inner or i in self.nope_layers:
                return None
            return shared if entry.shared else make()

        t = cfg.temperature
        self.blocks = nn.ModuleList(
            Block(cfg, layer_encoding(i), t if t is not None and t.applies_to(i) else None)
            for i in range(cfg.num_layers)
        )
        self.norm = nn.RMSNorm(cfg.dim)
        self.drop = nn.Dropout(cfg.dropout)
        self.apply(self._init)

    def reset_parameters(self) -> None:
        """Initialize the whole model as the constructor does (after ``to_empty()`` on a
        meta-built model, :mod:`posenc.deferred`): every submodule's ``reset_parameters`` in
        the order they were built (each shared encoding once), then the model's own init of
        linear and embedding weights. With the same seed, the weights of a direct build."""
        self._reset_tree({id(self)})

    def _reset_tree(self, seen: set[int]) -> None:
        reset_submodules(self, seen)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def new_caches(self) -> list[KVCache]:
        return [KVCache() for _ in self.blocks]

    def hidden(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        caches: list[KVCache] | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Shapes: ``tokens [b, s]`` -> final normed hidden states ``[b, s, dim]``."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be [batch, seq], got shape {tuple(tokens.shape)}")
        if tokens.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"tokens must be int64 (or int32) token ids, got {tokens.dtype}")
        if caches is not None and len(caches) != len(self.blocks):
            raise ValueError(
                f"caches must hold one KVCache per layer ({len(self.blocks)}), got {len(caches)}; "
                "use model.new_caches()"
            )
        x = self.embed(tokens)  # [b, s, dim]
        if self.absolute is not None:
            if positions is None and caches is not None and caches[0].length:
                past = caches[0].length
                positions = torch.arange(past, past + tokens.shape[1], device=tokens.device)
            x = self.absolute(x, positions)
        x = self.drop(x)
        # Positions checked once, and each encoding's cos/sin or bias made once, for all layers.
        b, s = tokens.shape
        past = caches[0].length if caches is not None else 0
        ctx = position_context(positions, batch=b, seq=s, device=tokens.device, past=past)
        for i, block in enumerate(self.blocks):
            x = block(x, ctx, caches[i] if caches is not None else None, attn_mask)
        return self.norm(x)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        caches: list[KVCache] | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Shapes: ``tokens [b, s]`` -> logits ``[b, s, vocab_size]`` (head tied to the embedding)."""
        return F.linear(self.hidden(tokens, positions, caches, attn_mask), self.embed.weight)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
