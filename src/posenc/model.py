"""A small pre-norm decoder-only language model for the lab, with the encoding chosen by name."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import registry
from .attention import Attention, KVCache


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.down(F.gelu(self.up(x))))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, encoding: nn.Module | None) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.dim)
        self.attn = Attention(
            cfg.dim,
            cfg.num_heads,
            cfg.num_kv_heads,
            causal=cfg.causal,
            encoding=encoding,
            dropout=cfg.dropout,
        )
        self.norm2 = nn.RMSNorm(cfg.dim)
        self.mlp = MLP(cfg.dim, int(cfg.dim * cfg.mlp_ratio), cfg.dropout)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None,
        cache: KVCache | None,
        attn_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), positions, cache=cache, attn_mask=attn_mask)
        return x + self.mlp(self.norm2(x))


class TransformerLM(nn.Module):
    """Token embedding, optional absolute encoding, ``num_layers`` pre-norm blocks, tied head.

    Encodings that act inside attention are built once and shared by every layer when the
    registry marks them ``shared`` (RoPE, ALiBi, T5's bias), else once per layer.
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

        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.absolute: nn.Module | None = make() if entry.family == "absolute" else None
        inner = entry.family in ("rotary", "bias", "relative")
        shared = make() if inner and entry.shared else None
        self.blocks = nn.ModuleList(
            Block(cfg, (shared if entry.shared else make()) if inner else None)
            for _ in range(cfg.num_layers)
        )
        self.norm = nn.RMSNorm(cfg.dim)
        self.drop = nn.Dropout(cfg.dropout)
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
        for i, block in enumerate(self.blocks):
            x = block(x, positions, caches[i] if caches is not None else None, attn_mask)
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
