"""Lab data: byte-level corpora split by file, cached as memory-mapped arrays, and the batches
the trainer and the evaluator read from them.

The default corpus is real text present on every machine that has Python: the source files of
the standard library, read as bytes (vocabulary 256, so "bits per token" is "bits per byte").
Files are assigned to train/valid/test by a seeded shuffle (never a file in two splits), then
concatenated with a NUL byte between files (NUL does not occur in source text, so it marks a
boundary the model can learn).

Every source implements :class:`LabData`: ``train_batch`` (random windows, a pure function of
``(seed, step)`` so a resumed run reads exactly the batches it would have read) and
``eval_windows`` (fixed windows of the test split).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import random
import shutil
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from ..cells.config import DataConfig
from .batches import IGNORE, SPLITS, shard, step_generator

__all__ = [
    "IGNORE", "SPLITS", "ByteCorpus", "DataUnavailable", "LabData", "corpus_note", "load_data",
    "shard", "split_files", "step_generator",
]  # fmt: skip

FILE_SEPARATOR = b"\x00"
_CACHE_FORMAT = 1
# Directories never read from the standard library: installed packages, bytecode, and (unless
# include_tests) the test suites, which are half of its bytes and mostly generated-looking code.
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
_TEST_DIRS = {"test", "tests", "idle_test"}


class LabData(Protocol):
    """What the trainer and evaluator need from a data source.

    ``x [b, s]`` are input tokens, ``y [b, s]`` the targets (``y[:, i]`` follows ``x[:, :i+1]``),
    ``IGNORE`` where a position is not scored. Both int64 on the CPU.
    """

    @property
    def name(self) -> str: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def fingerprint(self) -> str:
        """Identifies the data's content: part of every cell's hash."""
        ...

    @property
    def unit(self) -> str:
        """What one scored target is: ``"byte"`` or ``"token"``."""
        ...

    def train_batch(
        self, step: int, batch_size: int, seq_len: int, seed: int, rank: int = 0, world: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def eval_windows(
        self, seq_len: int, max_tokens: int, stride: int | None = None, split: str = "test"
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...


class DataUnavailable(RuntimeError, ValueError):
    """The data a grid names cannot be read here (a package or a cached dataset is missing).

    A ValueError too, so the CLI reports it in one line like any other bad option; still a
    RuntimeError for callers that caught that before."""


# --- byte corpora --------------------------------------------------------------------------


def cache_root() -> Path:
    """``$POSENC_CACHE``, else ``$XDG_CACHE_HOME/posenc``, else ``~/.cache/posenc``."""
    if os.environ.get("POSENC_CACHE"):
        return Path(os.environ["POSENC_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "posenc"


@dataclass
class ByteCorpus:
    """A byte-level corpus with memory-mapped ``train``/``valid``/``test`` splits.

    ``fingerprint`` hashes the split contents, so results on different data never share a key.
    """

    name: str
    splits: dict[str, np.ndarray]  # each a uint8 array [n]
    fingerprint: str
    files: dict[str, int]  # files per split
    vocab_size: int = 256
    unit: str = "byte"

    def split(self, name: str) -> np.ndarray:
        if name not in self.splits:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {name!r}")
        return self.splits[name]

    def train_batch(
        self, step: int, batch_size: int, seq_len: int, seed: int, rank: int = 0, world: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Random windows of the train split: ``x, y [batch_size // world, seq_len]``.

        The global batch's offsets depend only on ``(seed, step)``; ``rank`` takes its rows.
        """
        data = self.split("train")
        if len(data) < seq_len + 2:
            raise ValueError(
                f"the train split has {len(data)} bytes, too few for windows of {seq_len + 1}"
            )
        g = step_generator(seed, step)
        offsets = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=g)
        offsets = offsets[shard(batch_size, rank, world)]
        win = np.stack([data[o : o + seq_len + 1] for o in offsets.tolist()])  # [b, s + 1]
        win_t = torch.from_numpy(win.astype(np.int64))
        return win_t[:, :-1], win_t[:, 1:]

    def eval_windows(
        self, seq_len: int, max_tokens: int, stride: int | None = None, split: str = "test"
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Windows ``x, y [1, seq_len]`` scoring targets ``1 .. T`` of the split once each.

        ``T = max_tokens`` rounded down to whole windows (non-overlapping), or ``max_tokens``
        (sliding: each window after the first scores only its last ``stride`` targets, so every
        scored byte sees at least ``seq_len - stride`` bytes of context).
        """
        data = self.split(split)
        total = min(max_tokens, len(data) - 1)
        if total < seq_len:
            raise ValueError(
                f"the {split} split has {len(data)} bytes; eval length {seq_len} needs at least "
                f"{seq_len + 1} (use a shorter eval length or a bigger corpus)"
            )
        yield from _windows(data, seq_len, total, stride)


def _windows(
    data: np.ndarray, seq_len: int, total: int, stride: int | None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    if stride is None:
        for start in range(0, total - seq_len + 1, seq_len):
            win = torch.from_numpy(data[start : start + seq_len + 1].astype(np.int64))
            yield win[None, :-1], win[None, 1:]
        return
    if not 1 <= stride <= seq_len:
        raise ValueError(f"stride must be in 1..{seq_len} (the eval length), got {stride}")
    end = 0  # targets [0, end) are scored already
    while end < total:
        # The first window scores all its targets; each later one its last `stride`.
        stop = min(total, seq_len if end == 0 else end + stride)
        start = max(0, stop - seq_len)
        win = torch.from_numpy(data[start : start + seq_len + 1].astype(np.int64))
        x, y = win[None, :-1], win[None, 1:].clone()  # [1, s] each
        y[:, : end - start] = IGNORE
        y[:, stop - start :] = IGNORE
        yield x, y
        end = stop


def stdlib_files(include_tests: bool = False) -> tuple[Path, list[Path]]:
    """The standard library's ``*.py`` files (sorted), without site-packages (and tests)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = _SKIP_DIRS | (set() if include_tests else _TEST_DIRS)
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip)
        files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    if not files:
        raise FileNotFoundError(f"no *.py files found under the standard library at {root}")
    return root, sorted(files)


def text_files(spec: str) -> tuple[Path, list[Path]]:
    """Files named by ``spec``: a file, a directory (every file under it) or a glob."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path.parent, [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not _hidden(p, path))
        root = path
    else:
        files = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
        root = Path(os.path.commonpath([str(p.parent) for p in files])) if files else path.parent
    if not files:
        raise FileNotFoundError(f"--text {spec!r} names no file, directory or matching glob")
    return root, files


def _hidden(p: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in p.relative_to(root).parts)


def split_files(
    names: list[str], sizes: list[int], seed: int, valid_frac: float, test_frac: float
) -> dict[str, list[int]]:
    """Indices of ``names`` per split: a seeded shuffle, then test and valid take files until
    they hold their fraction of the bytes; train takes the rest."""
    if not (0 <= valid_frac < 1 and 0 <= test_frac < 1 and valid_frac + test_frac < 1):
        raise ValueError(
            f"valid_frac + test_frac must be in [0, 1), got {valid_frac} + {test_frac}"
        )
    order = sorted(range(len(names)), key=lambda i: names[i])
    random.Random(seed).shuffle(order)
    total = sum(sizes)
    out: dict[str, list[int]] = {s: [] for s in SPLITS}
    filled = {"test": 0, "valid": 0}
    goal = {"test": test_frac * total, "valid": valid_frac * total}
    for i in order:
        target = next((s for s in ("test", "valid") if filled[s] < goal[s]), "train")
        out[target].append(i)
        if target != "train":
            filled[target] += sizes[i]
    return out


def build_byte_corpus(
    name: str, chunks: list[tuple[str, bytes]], cfg: DataConfig, cache_dir: Path
) -> ByteCorpus:
    """Split ``(name, bytes)`` chunks into a cached corpus at ``cache_dir`` (written atomically).

    Fewer than 3 chunks cannot be split by file, so their concatenation is split by position
    (train first, then valid, then test).
    """
    if len(chunks) >= 3:
        idx = split_files(
            [n for n, _ in chunks],
            [len(b) for _, b in chunks],
            cfg.split_seed,
            cfg.valid_frac,
            cfg.test_frac,
        )
        parts = {s: FILE_SEPARATOR.join(chunks[i][1] for i in sorted(idx[s])) for s in SPLITS}
        files = {s: len(idx[s]) for s in SPLITS}
    else:
        blob = FILE_SEPARATOR.join(b for _, b in chunks)
        n_test, n_valid = int(len(blob) * cfg.test_frac), int(len(blob) * cfg.valid_frac)
        n_train = len(blob) - n_test - n_valid
        parts = {
            "train": blob[:n_train],
            "valid": blob[n_train : n_train + n_valid],
            "test": blob[n_train + n_valid :],
        }
        files = {s: len(chunks) for s in SPLITS}
    for s in ("train", "test"):
        if len(parts[s]) < 2:
            raise ValueError(f"corpus {name!r} is too small: its {s} split is empty")
    return _write_cache(name, parts, files, cache_dir)


def load_cached(cache_dir: Path) -> ByteCorpus:
    meta = json.loads((cache_dir / "meta.json").read_text())
    splits: dict[str, np.ndarray] = {}
    for s in SPLITS:
        path = cache_dir / f"{s}.bin"
        n = path.stat().st_size
        # np.memmap cannot map an empty file; an empty valid split is allowed.
        splits[s] = np.memmap(path, dtype=np.uint8, mode="r") if n else np.zeros(0, np.uint8)
    return ByteCorpus(meta["name"], splits, meta["fingerprint"], meta["files"])


def _file_key(files: list[Path], root: Path) -> list[tuple[str, int, int]]:
    out = []
    for f in files:
        st = f.stat()
        out.append((str(f.relative_to(root)), st.st_size, st.st_mtime_ns))
    return out


def _corpus_from_files(kind: str, root: Path, files: list[Path], cfg: DataConfig) -> ByteCorpus:
    key_obj = {
        "format": _CACHE_FORMAT,
        "kind": kind,
        "root": str(root),
        "files": _file_key(files, root),
        "split": {
            k: v for k, v in asdict(cfg).items() if k in ("split_seed", "valid_frac", "test_frac")
        },
    }
    key = hashlib.sha256(json.dumps(key_obj, sort_keys=True).encode()).hexdigest()[:16]
    cache_dir = cache_root() / "corpus" / f"{kind}-{key}"
    if (cache_dir / "meta.json").exists():
        return load_cached(cache_dir)
    chunks = [(str(f.relative_to(root)), f.read_bytes()) for f in files]
    return build_byte_corpus(kind, chunks, cfg, cache_dir)


def hf_corpus(cfg: DataConfig) -> ByteCorpus:
    """A Hugging Face dataset from the local cache (no network), its ``text`` column as UTF-8."""
    assert cfg.dataset is not None
    name, _, config = cfg.dataset.partition(":")
    key = hashlib.sha256(f"hf:{cfg.dataset}:{cfg.split_seed}".encode()).hexdigest()[:16]
    cache_dir = cache_root() / "corpus" / f"hf-{key}"
    if (cache_dir / "meta.json").exists():
        return load_cached(cache_dir)
    # The local cache only, never a download. `datasets` reads these variables when it is first
    # imported, so they are set around the import and the load, then restored.
    offline = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    saved = {k: os.environ.get(k) for k in offline}
    os.environ.update(offline)
    try:
        try:
            import datasets
        except ImportError:
            raise DataUnavailable(
                f"--dataset {cfg.dataset!r} needs the `datasets` package (pip install datasets) "
                "and the dataset in its local cache"
            ) from None
        try:
            ds = datasets.load_dataset(name, config or None)
        except Exception as e:
            raise DataUnavailable(
                f"could not load Hugging Face dataset {cfg.dataset!r} from the local cache: {e}"
            ) from e
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    aliases = {"train": ("train",), "valid": ("validation", "valid", "dev"), "test": ("test",)}
    parts: dict[str, bytes] = {}
    for s, names in aliases.items():
        split_name = next((n for n in names if n in ds), None)
        if split_name is not None:
            column = "text" if "text" in ds[split_name].column_names else None
            if column is None:
                raise ValueError(
                    f"dataset {cfg.dataset!r} has no 'text' column "
                    f"(columns: {ds[split_name].column_names})"
                )
            parts[s] = "\n".join(ds[split_name][column]).encode("utf-8")
    if "train" not in parts:
        raise ValueError(f"dataset {cfg.dataset!r} has no train split (splits: {list(ds)})")
    if "test" not in parts:
        chunks = [("train", parts["train"])]
        return build_byte_corpus(f"hf:{cfg.dataset}", chunks, cfg, cache_dir)
    # The dataset's own splits are used as they are; write them through the same cache format.
    full = {s: parts.get(s, b"") for s in SPLITS}
    return _write_cache(f"hf:{cfg.dataset}", full, {s: 1 for s in SPLITS}, cache_dir)


def _write_cache(
    name: str, parts: dict[str, bytes], files: dict[str, int], cache_dir: Path
) -> ByteCorpus:
    """Write the splits and ``meta.json`` to a temporary folder, then rename it into place
    (atomic: a reader sees no cache or a whole one; a racing writer's copy is as good)."""
    h = hashlib.sha256()
    for s in SPLITS:
        h.update(s.encode() + len(parts[s]).to_bytes(8, "little") + parts[s])
    meta = {
        "format": _CACHE_FORMAT,
        "name": name,
        "fingerprint": h.hexdigest()[:16],
        "files": files,
        "bytes": {s: len(parts[s]) for s in SPLITS},
    }
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=cache_dir.name + ".tmp", dir=cache_dir.parent))
    try:
        for s in SPLITS:
            (tmp / f"{s}.bin").write_bytes(parts[s])
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            os.replace(tmp, cache_dir)
        except OSError:
            if not (cache_dir / "meta.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return load_cached(cache_dir)


def load_data(cfg: DataConfig) -> LabData:
    """The data source ``cfg`` names (building and caching a corpus on first use)."""
    if cfg.source == "stdlib":
        root, files = stdlib_files(cfg.include_tests)
        return _corpus_from_files("stdlib", root, files, cfg)
    if cfg.source == "text":
        if not cfg.path:
            raise ValueError("source 'text' needs a path (--text PATH)")
        root, files = text_files(cfg.path)
        return _corpus_from_files("text", root, files, cfg)
    if cfg.source == "hf":
        if not cfg.dataset:
            raise ValueError("source 'hf' needs a dataset name (--dataset NAME[:CONFIG])")
        return hf_corpus(cfg)
    if cfg.source == "task":
        from ..evaluation.tasks import make_task

        if not cfg.task:
            raise ValueError("source 'task' needs a task name (--task NAME)")
        return make_task(cfg.task)
    raise ValueError(f"data source must be stdlib, text, hf or task, got {cfg.source!r}")


def corpus_note(cfg: DataConfig, data: LabData, eval_tokens: int) -> str | None:
    """The run's line on its corpus: for ``--text``, its files and bytes and its test split;
    for any byte corpus whose test split holds fewer targets than ``eval_tokens``, that the
    per-length budget is capped to the split (:meth:`ByteCorpus.eval_windows`). None for a
    synthetic task, or a corpus with nothing to say."""
    if not isinstance(data, ByteCorpus):
        return None
    test = len(data.split("test"))
    usable = max(test - 1, 0)  # targets: every byte after the first
    capped = usable < eval_tokens
    files = _text_sizes(cfg)
    if files is not None:
        head = (
            f"--text {cfg.path}: {len(files):,} file(s), {sum(files):,} bytes; test split "
            f"{test:,} bytes"
        )
    elif capped:
        head = f"data {data.name}: test split {test:,} bytes"
    else:
        return None
    if capped:
        return (
            f"{head}, so --eval-tokens {eval_tokens} is capped to {usable:,} per length (at "
            "most: whole windows of each length)"
        )
    return f"{head}, {eval_tokens:,} tokens scored per length (--eval-tokens)"


def _text_sizes(cfg: DataConfig) -> list[int] | None:
    """The sizes of the files ``--text`` names (None for another source, or files gone)."""
    if cfg.source != "text" or not cfg.path:
        return None
    try:
        return [f.stat().st_size for f in text_files(cfg.path)[1]]
    except OSError:
        return None
