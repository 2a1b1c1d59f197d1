"""What ``posenc lab extend`` will run, decided before anything trains: its configuration
(:class:`ExtendConfig`, defaults filled in from the grid by :func:`resolve`), which finished
grid cells can be extended and how (:data:`ROPE_METHODS` for a rotary cell, the fine-tune alone
for a bias), and the list of fine-tunes and reference trainings with the identity that keys each
one's checkpoints and rows (:func:`jobs`, :func:`extend_group`). The running is
:mod:`posenc.lab.extension.extend`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ... import registry
from ...functional.rope_scaling import ROPE_SCALING, extension_scaling
from ...model import ModelConfig
from ...runs.identity import jsonable, stable_hash
from ..cells.config import TrainConfig
from ..cells.identity import model_identity
from ..reports.rows import EXTEND, REFERENCE, GridRow

#: The RoPE methods a rotary cell is fine-tuned with ("none": no rescaling).
ROPE_METHODS: tuple[str, ...] = ("none", "linear", "ntk", "yarn", "longrope", "dynamic")


def bias_encodings() -> tuple[str, ...]:
    """The bias encodings extended by the fine-tune alone (no rescaling exists for them): the
    registry's bias family as it stands when called, so a bias registered after this module
    was imported is extendable (``BIAS_ENCODINGS`` reads the same, also when read)."""
    return tuple(registry.names("bias"))


def default_encodings() -> tuple[str, ...]:
    """What ``posenc lab extend`` extends by default: ``rope`` and every registered bias."""
    return ("rope", *bias_encodings())


def __getattr__(name: str) -> Any:
    # ``BIAS_ENCODINGS`` was a tuple read from the registry at import; it is read when asked.
    if name == "BIAS_ENCODINGS":
        return bias_encodings()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


EXTEND_DIR = "extend"


@dataclass(frozen=True)
class ExtendConfig:
    """What ``posenc lab extend`` runs; None takes the default derived from the grid.

    ``target``: the fine-tune length as a multiple of the grid's train length ``L``.
    ``steps``: fine-tune steps (None: 2% of the grid's training steps, at least 1). ``lr``:
    constant learning rate after ``warmup_steps`` (None: the grid's final one; 2% of ``steps``,
    at least 1). ``curve``: steps at which the target length is evaluated (None: 1, 2, 5, 10,
    20, 50, ... below ``steps``). ``methods``: :data:`ROPE_METHODS` to fine-tune RoPE cells
    with. ``encodings``: the grid's encodings to extend, ``rope`` and the bias family
    (:func:`extendable`; default: ``rope`` and the biases registered when the config is made,
    :func:`default_encodings`). ``reference``: encodings trained from scratch at the target
    length, each from the grid's plain cell of that name (no options).

    The table's tolerance (bits within which a method counts as recovered) is the report's
    (:func:`posenc.lab.reports.extend_report.extend_table`), not part of a run.
    """

    target: float = 4.0
    steps: int | None = None
    lr: float | None = None
    warmup_steps: int | None = None
    methods: tuple[str, ...] = ROPE_METHODS
    encodings: tuple[str, ...] = field(default_factory=default_encodings)
    reference: tuple[str, ...] = ("rope",)
    curve: tuple[int, ...] | None = None


#: The largest target multiple: past it the evaluation lengths and the fine-tune's memory grow
#: past anything the presets are sized for.
MAX_TARGET = 64.0


@dataclass(frozen=True)
class BaseCell:
    """One finished grid cell to extend."""

    row: GridRow
    model: ModelConfig
    train: TrainConfig

    @property
    def label(self) -> str:
        return self.row.encoding

    @property
    def seed(self) -> int:
        return int(self.row.seed)

    @property
    def train_len(self) -> int:
        return int(self.row.train_len)


@dataclass(frozen=True)
class ExtendJob:
    """One fine-tune (a base cell and a method) or one reference training."""

    kind: str
    base: BaseCell
    method: str
    model: ModelConfig
    train: TrainConfig
    identity: dict[str, Any]
    init: bool  # start from the base cell's weights (a fine-tune) or from scratch (reference)

    @property
    def hash(self) -> str:
        return stable_hash(self.identity)

    @property
    def label(self) -> str:
        if self.kind == REFERENCE:
            return f"{self.base.label} @{self.model.max_len} from scratch"
        if self.method == "none":
            return self.base.label
        return f"{self.base.label} + {ROPE_SCALING[self.method].label}"


def default_curve(steps: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... below ``steps``: log-spaced points of the recovery curve."""
    out: list[int] = []
    k = 1
    while True:
        for m in (1, 2, 5):
            if m * k >= steps:
                return tuple(out)
            out.append(m * k)
        k *= 10


def resolve(cfg: ExtendConfig, base_train: TrainConfig) -> ExtendConfig:
    """``cfg`` with its defaults filled in from the grid's training settings, checked."""
    if not (isinstance(cfg.target, (int, float)) and 1 < cfg.target <= MAX_TARGET):
        raise ValueError(
            f"target must be a multiple of the train length in (1, {MAX_TARGET:g}], "
            f"got {cfg.target}"
        )
    steps = cfg.steps if cfg.steps is not None else max(1, round(0.02 * base_train.steps))
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    lr = cfg.lr if cfg.lr is not None else base_train.lr * base_train.min_lr_ratio
    if not (isinstance(lr, (int, float)) and 0 < lr < math.inf):
        raise ValueError(f"lr must be a positive finite number, got {lr}")
    # 2% of the steps, as the PI paper's 20 of 1000 (at least 1): 10- and 50-step runs share it.
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else max(1, round(0.02 * steps))
    curve = cfg.curve if cfg.curve is not None else default_curve(steps)
    bad = [c for c in curve if not 0 < c < steps]
    if bad:
        within = (
            f"in 1..{steps - 1}" if steps > 1 else "none: a 1-step fine-tune has no steps between"
        )
        raise ValueError(
            f"curve steps are the fine-tune steps between 0 and steps={steps} ({within}), got {bad}"
        )
    unknown = [m for m in cfg.methods if m not in ROPE_METHODS]
    if unknown or not cfg.methods:
        raise ValueError(
            f"RoPE methods must be some of {', '.join(ROPE_METHODS)}, got {list(cfg.methods)}"
        )
    if not cfg.encodings:
        raise ValueError("no encodings to extend")
    for name in (*cfg.encodings, *cfg.reference):
        registry.entry(name)  # raises naming the registered encodings
        if not extendable(name):
            allowed = ", ".join(n for n in registry.names() if extendable(n))
            raise ValueError(
                f"{name!r} cannot be extended here: extend fine-tunes RoPE (with each rescaling) "
                f"and the bias encodings (unchanged); allowed: {allowed}"
            )
    missing = [r for r in cfg.reference if r not in cfg.encodings]
    if missing:
        raise ValueError(
            f"reference {missing} must also be extended (--encodings): a reference is trained "
            "like the grid's cell of that encoding"
        )
    return replace(cfg, steps=steps, lr=lr, warmup_steps=warmup, curve=tuple(sorted(set(curve))))


def extendable(name: str) -> bool:
    """Whether ``posenc lab extend`` can fine-tune encoding ``name`` at a longer length:
    rotary encodings that take a Hugging Face scaling dict (``rope``), and the bias family
    (nothing sized by the train length). Absolute tables are sized to L; xPos and the
    relative family have no rescaling here."""
    entry = registry.entry(name)
    if entry.family == "bias":
        return True
    return entry.family == "rotary" and "scaling" in registry.options(name)


def base_cells(rows: list[dict[str, Any]], encodings: tuple[str, ...]) -> list[BaseCell]:
    """The grid rows whose encoding is one of ``encodings`` (by name, any options), in order."""
    out = []
    for row in rows:
        if row.get("kind") or row.get("encoding_name") not in encodings:
            continue
        ident = row["identity"]["train"]
        model = ModelConfig(**ident["model"])
        out.append(BaseCell(GridRow.from_dict(row), model, TrainConfig(**ident["train"])))
    return out


def target_len(base: BaseCell, cfg: ExtendConfig) -> int:
    t = round(cfg.target * base.train_len)
    if abs(t - cfg.target * base.train_len) > 1e-9:
        raise ValueError(
            f"target {cfg.target} x train length {base.train_len} is not a whole length"
        )
    return t


def method_model(base: BaseCell, method: str, length: int) -> ModelConfig:
    """The base cell's model at ``length`` with RoPE rescaling ``method`` (rotary cells)."""
    kwargs = dict(base.model.encoding_kwargs)
    if method not in ("none", "default"):
        rotary_dim = kwargs.get("rotary_dim") or base.model.dim // base.model.num_heads
        factor = length / base.train_len
        kwargs["scaling"] = extension_scaling(method, factor, base.train_len, rotary_dim // 2)
    return replace(base.model, max_len=length, encoding_kwargs=kwargs)


def same_tokens(train: TrainConfig, train_len: int, length: int) -> TrainConfig:
    """``train`` at sequences of ``length``: the same steps and tokens per step, so a batch of
    ``batch_size * train_len / length`` sequences; refused when that is not a whole number
    (the reference would see other tokens than the grid)."""
    tokens = train.batch_size * train_len
    if tokens % length:
        raise ValueError(
            f"a reference at {length} tokens cannot take the grid's {tokens} tokens per step "
            f"({train.batch_size} x {train_len}) in whole sequences; choose a target that "
            "divides them, or pass --reference none"
        )
    return replace(train, batch_size=tokens // length)


def jobs(bases: list[BaseCell], cfg: ExtendConfig) -> list[ExtendJob]:
    """Fine-tunes (every base x its methods), then one reference per plain reference cell
    (one per seed)."""
    assert cfg.steps is not None and cfg.lr is not None and cfg.warmup_steps is not None
    out: list[ExtendJob] = []
    for base in bases:
        length = target_len(base, cfg)
        tune = replace(
            base.train, steps=cfg.steps, lr=cfg.lr, warmup_steps=cfg.warmup_steps, min_lr_ratio=1.0
        )
        methods = cfg.methods if registry.entry(base.model.encoding).family == "rotary" else ()
        for method in methods or ("none",):
            model = method_model(base, method, length)
            ident = jsonable(
                {
                    "kind": EXTEND,
                    "base": base.row.train_hash,
                    "method": method,
                    "model": model_identity(model),
                    "train": asdict(tune),
                }
            )
            out.append(ExtendJob(EXTEND, base, method, model, tune, ident, init=True))
    for base in bases:
        # The grid's plain cell of a reference encoding (its label is the bare name): a
        # `rope:nope_every=2` or `rope:base=500` cell is not the bar for plain RoPE.
        if base.label not in cfg.reference:
            continue
        model = replace(base.model, max_len=target_len(base, cfg))
        train = same_tokens(base.train, base.train_len, model.max_len)
        ident = jsonable(
            {
                "kind": REFERENCE,
                "model": model_identity(model),
                "train": asdict(train),
                "data": base.row.identity["train"]["data"],
                "seed": base.seed,
            }
        )
        out.append(ExtendJob(REFERENCE, base, "none", model, train, ident, init=False))
    return out


def extend_group(base_group: str, cfg: ExtendConfig) -> str:
    """The table a run's rows belong to: the grid and what every fine-tune shares (target,
    steps, learning rate, warmup). Not the methods, encodings, references or curve: a rerun
    with more of them adds rows to the same table."""
    shared = {k: getattr(cfg, k) for k in ("target", "steps", "lr", "warmup_steps")}
    return stable_hash({"base": base_group, "extend": shared})
