"""A grid cell resolved once: its label parsed, its lab options resolved, its model config
built and its identities hashed, in one frozen :class:`Cell` that preflight, the grid and the
result rows all read.

:func:`resolve_labels` expands a grid's encodings (``default``, ``all``, ``length``) and checks
each label against the registry; :func:`resolve_cell` turns one label and seed into a cell.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from ... import registry
from ...model import ModelConfig
from ...runs.identity import jsonable, stable_hash
from .config import DEFAULT_ENCODINGS, LENGTH_ENCODINGS, LabConfig
from .identity import cell_identity, eval_identity, train_identity
from .labels import Label, parse_label
from .options import (
    LAB_OPTIONS,
    LabOptions,
    PositionSampling,
    check_lab_options,
    resolve_options,
    split_options,
)


def check_name(name: str) -> None:
    """ValueError for an encoding name that is not registered: the closest registered names,
    all of them, and how an encoding of the user's own gets in (``--import``)."""
    try:
        registry.entry(name)
    except ValueError:
        names = registry.names()
        close = difflib.get_close_matches(name.strip().lower(), names, n=3, cutoff=0.0)
        raise ValueError(
            f"unknown encoding {name!r} (did you mean {' or '.join(map(repr, close))}?); registered: "
            f"{', '.join(names)}; for an encoding of your own, add --import MODULE (the module "
            "whose register() call adds it) or name it MODULE:NAME"
        ) from None


def check_label(label: Label) -> Label:
    """``label`` if its name is registered and its options are the encoding's or the lab's."""
    check_name(label.name)
    own = registry.options(label.name)
    enc, lab = split_options(label.given)
    unknown = sorted(set(enc) - set(own))
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for encoding {label.name!r}; allowed: "
            f"{sorted(own) or 'none'}, and the lab's {list(LAB_OPTIONS)}"
        )
    check_lab_options(label.name, lab)
    return label


def resolve_labels(encodings: tuple[str, ...] | list[str]) -> list[Label]:
    """Expand ``default``/``all``/``length`` and check every label against the registry.

    ``default`` is :data:`DEFAULT_ENCODINGS` that are registered; ``all`` every registered name;
    ``length`` the length-generalization set :data:`LENGTH_ENCODINGS` (training-time length
    methods and Llama-4's options). A label's options are the encoding's registry options and
    the lab options :data:`LAB_OPTIONS`, which every encoding takes. Unknown names, unknown
    options and bad lab option values fail here, before anything trains.
    """
    out: list[Label] = []
    for text in encodings:
        text = text.strip()
        if text == "default":
            registered = set(registry.names())
            expanded = [parse_label(n) for n in DEFAULT_ENCODINGS if n in registered]
        elif text == "all":
            registry.load_entry_points()  # installed packages' encodings are in 'all' too
            expanded = [parse_label(n) for n in registry.names()]
        elif text == "length":
            expanded = [check_label(parse_label(e)) for e in LENGTH_ENCODINGS]
        else:
            expanded = [check_label(parse_label(text))]
        seen = {label.text for label in out}
        out.extend(e for e in expanded if e.text not in seen)
    if not out:
        raise ValueError("no encodings to run")
    return out


def resolve_encodings(encodings: tuple[str, ...] | list[str]) -> list[str]:
    """:func:`resolve_labels` as label strings."""
    return [label.text for label in resolve_labels(encodings)]


def cell_model(cfg: LabConfig, label: Label, options: LabOptions, vocab_size: int) -> ModelConfig:
    """The :class:`ModelConfig` of ``label`` in grid ``cfg``: the lab options become
    ``nope_every`` and ``temperature``, the rest the encoding's options."""
    kwargs, _ = split_options(label.options(cfg))
    return ModelConfig(
        vocab_size=vocab_size,
        dim=cfg.model.dim,
        num_layers=cfg.model.num_layers,
        num_heads=cfg.model.num_heads,
        max_len=cfg.train_len,
        mlp_ratio=cfg.model.mlp_ratio,
        dropout=cfg.model.dropout,
        causal=True,
        encoding=label.name,
        encoding_kwargs=kwargs,
        nope_every=options.nope_every,
        temperature=options.query_temperature(cfg.model.num_layers, cfg.train_len),
    )


@dataclass(frozen=True)
class Cell:
    """One ``(label, seed)`` of a grid, resolved: what preflight builds, the grid trains and a
    result row records. ``train_id`` decides the weights (the checkpoint's identity),
    ``eval_id`` the metrics; their hashes key the checkpoint folder and the row."""

    label: Label
    seed: int
    model: ModelConfig
    options: LabOptions
    train_id: dict[str, Any] = field(hash=False)
    eval_id: dict[str, Any] = field(hash=False)

    @property
    def encoding(self) -> str:
        return self.label.text

    @property
    def positions(self) -> PositionSampling | None:
        return self.options.positions

    @property
    def title(self) -> str:
        return f"{self.label.text} (seed {self.seed})"

    @property
    def identity(self) -> dict[str, Any]:
        return cell_identity(self.train_id, self.eval_id)

    @property
    def train_hash(self) -> str:
        return stable_hash(self.train_id)

    @property
    def config_hash(self) -> str:
        return stable_hash(self.identity)


def resolve_cell(
    cfg: LabConfig,
    label: Label | str,
    seed: int,
    vocab_size: int,
    data_fingerprint: str,
    eval_id: dict[str, Any] | None = None,
) -> Cell:
    """Cell ``(label, seed)`` of grid ``cfg`` on data of ``vocab_size`` tokens whose fingerprint
    is ``data_fingerprint`` (``eval_id``: the grid's :func:`eval_identity`, computed once by a
    caller that resolves many cells). Raises ValueError for options that do not fit the grid,
    and for a grid ``posenc lab``'s options would refuse (:func:`~posenc.lab.cells.flags.check_grid`)."""
    from .flags import check_grid

    check_grid(cfg)
    label = parse_label(label) if isinstance(label, str) else label
    options = resolve_options(cfg, label)
    model = cell_model(cfg, label, options, vocab_size)
    train_id = train_identity(cfg, model, seed, data_fingerprint, options.positions)
    if eval_id is None:
        eval_id = jsonable(eval_identity(cfg))
    return Cell(label, seed, model, options, train_id, eval_id)
