"""posenc.lab data: corpora split by file, cached memmaps, step-seeded batches, eval windows,
synthetic tasks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posenc.lab.cells.presets import DataConfig
from posenc.lab.evaluation.tasks import (
    BOS,
    KEY,
    KEYS,
    PASSKEY_DEPTHS,
    PASSKEY_MIN_PER_DEPTH,
    SEP,
    TASKS,
    make_task,
)
from posenc.lab.training import data as D


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))


def _write_corpus(root, n_files=12, size=3000):
    rng = np.random.default_rng(0)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        text = "".join(chr(c) for c in rng.integers(32, 127, size))
        (root / f"mod{i:02d}.py").write_text(f"# file {i}\n" + text)
    return root


def test_split_files_is_a_seeded_partition():
    names = [f"f{i}" for i in range(50)]
    sizes = [100 + i for i in range(50)]
    a = D.split_files(names, sizes, seed=0, valid_frac=0.1, test_frac=0.1)
    b = D.split_files(names, sizes, seed=0, valid_frac=0.1, test_frac=0.1)
    c = D.split_files(names, sizes, seed=1, valid_frac=0.1, test_frac=0.1)
    assert a == b and a != c
    together = sorted(a["train"] + a["valid"] + a["test"])
    assert together == list(range(50))  # every file in exactly one split
    total = sum(sizes)
    for split in ("valid", "test"):
        got = sum(sizes[i] for i in a[split])
        assert 0.1 * total <= got < 0.1 * total + max(sizes)
    with pytest.raises(ValueError, match="valid_frac"):
        D.split_files(names, sizes, 0, 0.6, 0.5)


def test_text_corpus_splits_by_file_and_caches(tmp_path):
    root = _write_corpus(tmp_path / "corpus")
    cfg = DataConfig(source="text", path=str(root), valid_frac=0.1, test_frac=0.2)
    corpus = D.load_data(cfg)
    assert corpus.vocab_size == 256 and corpus.unit == "byte"
    assert sum(corpus.files.values()) == 12
    blobs = {s: bytes(corpus.split(s)) for s in D.SPLITS}
    # Splits are whole files joined by NUL: each file's text sits in exactly one split.
    for i in range(12):
        text = (root / f"mod{i:02d}.py").read_bytes()
        assert sum(text in blobs[s] for s in D.SPLITS) == 1
    again = D.load_data(cfg)
    assert again.fingerprint == corpus.fingerprint
    assert isinstance(again.split("train"), np.memmap)
    cached = list((tmp_path / "cache" / "corpus").iterdir())
    assert len(cached) == 1 and (cached[0] / "meta.json").exists()


def test_single_file_is_split_by_position(tmp_path):
    f = tmp_path / "one.txt"
    f.write_bytes(bytes(range(256)) * 40)
    corpus = D.load_data(DataConfig(source="text", path=str(f)))
    parts = [bytes(corpus.split(s)) for s in ("train", "valid", "test")]
    assert b"".join(parts) == f.read_bytes()


def test_stdlib_corpus_is_python_source():
    corpus = D.load_data(DataConfig())
    train = corpus.split("train")
    assert len(train) > 1_000_000
    assert b"def " in bytes(train[:200_000]) and corpus.files["test"] > 5


def test_bad_sources_fail_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="names no file"):
        D.load_data(DataConfig(source="text", path=str(tmp_path / "missing*")))
    with pytest.raises(ValueError, match="data source must be"):
        D.load_data(DataConfig(source="nope"))
    with pytest.raises(ValueError, match="task must be one of"):
        D.load_data(DataConfig(source="task", task="sort"))


def test_train_batches_are_pure_functions_of_seed_and_step(tmp_path):
    corpus = D.load_data(DataConfig(source="text", path=str(_write_corpus(tmp_path / "c"))))
    x1, y1 = corpus.train_batch(5, 8, 32, seed=3)
    x2, y2 = corpus.train_batch(5, 8, 32, seed=3)
    x3, _ = corpus.train_batch(6, 8, 32, seed=3)
    x4, _ = corpus.train_batch(5, 8, 32, seed=4)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(x1, x3) and not torch.equal(x1, x4)
    assert x1.shape == y1.shape == (8, 32) and x1.dtype == torch.long
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are the next bytes
    # DDP ranks take disjoint rows whose union is the one-process batch.
    r0, _ = corpus.train_batch(5, 8, 32, seed=3, rank=0, world=2)
    r1, _ = corpus.train_batch(5, 8, 32, seed=3, rank=1, world=2)
    assert torch.equal(torch.stack([r0, r1], 1).reshape(8, 32), x1)
    with pytest.raises(ValueError, match="divisible"):
        corpus.train_batch(5, 7, 32, seed=3, world=2)


@pytest.mark.parametrize("stride", [None, 5, 16])
def test_eval_windows_score_each_target_once(tmp_path, stride):
    corpus = D.load_data(DataConfig(source="text", path=str(_write_corpus(tmp_path / "c"))))
    test = np.asarray(corpus.split("test"), dtype=np.int64)
    n, budget = 16, 200
    scored: dict[int, int] = {}
    for x, y in corpus.eval_windows(n, budget, stride):
        assert x.shape == y.shape == (1, n)
        # Locate the window: its inputs are a slice of the test split.
        starts = [s for s in range(len(test) - n) if np.array_equal(test[s : s + n], x[0].numpy())]
        start = starts[0]
        for i in np.nonzero(y[0].numpy() != D.IGNORE)[0]:
            target = start + int(i)  # index of the target among targets 0..T-1
            assert int(y[0, i]) == test[target + 1]
            scored[target] = scored.get(target, 0) + 1
            if stride is not None:
                assert i >= min(target, n - stride)  # at least n - stride bytes of context
    expected = (budget // n) * n if stride is None else budget
    assert sorted(scored) == list(range(expected)) and set(scored.values()) == {1}


def test_eval_length_longer_than_test_split_is_an_error(tmp_path):
    corpus = D.load_data(DataConfig(source="text", path=str(_write_corpus(tmp_path / "c"))))
    with pytest.raises(ValueError, match="eval length"):
        next(corpus.eval_windows(10**7, 10**8))


@pytest.mark.parametrize("name", TASKS)
def test_tasks_score_only_answers(name):
    task = make_task(name)
    x, y = task.train_batch(0, 4, 32, seed=0)
    x2, y2 = task.train_batch(0, 4, 32, seed=0)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert x.shape == y.shape == (4, 32)
    assert (x[:, 0] == BOS).all() and ((x == SEP).sum(1) == 1).all()
    scored = y != D.IGNORE
    assert scored.any(1).all()
    seq = torch.cat([x, y[:, -1:]], 1)
    sep = int((x[0] == SEP).nonzero()[0, 0])
    if name in ("copy", "reverse"):
        k = sep - 1
        a = seq[0, 1 : k + 1]
        want = a if name == "copy" else a.flip(0)
        assert torch.equal(y[0][scored[0]], want)
    elif name == "passkey":
        # The answer is the key that follows the KEY marker (tests/test_passkey_task.py).
        at = int((x[0] == KEY).nonzero()[0, 0])
        assert torch.equal(y[0][scored[0]], seq[0, at + 1 : at + 1 + int(scored[0].sum())])
    else:
        # Each answer is the value stored after the queried key's first occurrence.
        pairs = seq[0, 1:sep].view(-1, 2)
        table = {int(k): int(v) for k, v in pairs}
        for i in scored[0].nonzero()[:, 0].tolist():
            assert int(x[0, i]) in KEYS and int(y[0, i]) == table[int(x[0, i])]
    windows = list(task.eval_windows(64, 64 * 10))
    # The passkey task evaluates at least PASSKEY_MIN_PER_DEPTH sequences at each depth.
    want = 10 if name != "passkey" else PASSKEY_MIN_PER_DEPTH * len(PASSKEY_DEPTHS)
    assert sum(w[0].shape[0] for w in windows) == want
    with pytest.raises(ValueError, match="sliding"):
        next(task.eval_windows(64, 640, stride=8))


class _FakeSplit:
    def __init__(self, texts):
        self.texts, self.column_names = texts, ["text"]

    def __getitem__(self, key):
        assert key == "text"
        return self.texts


def test_hugging_face_dataset_from_the_local_cache(monkeypatch):
    import sys
    import types

    calls = []

    def load_dataset(name, config):
        calls.append((name, config, __import__("os").environ.get("HF_DATASETS_OFFLINE")))
        lines = [f"line {i} of {name}" for i in range(400)]
        return {
            "train": _FakeSplit(lines),
            "validation": _FakeSplit(lines[:50]),
            "test": _FakeSplit(["= test =", *lines[:80]]),
        }

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    corpus = D.load_data(DataConfig(source="hf", dataset="wikitext:wikitext-103-raw-v1"))
    assert calls == [("wikitext", "wikitext-103-raw-v1", "1")]  # offline: the cache only
    assert bytes(corpus.split("test")).startswith(b"= test =\nline 0")
    assert corpus.name == "hf:wikitext:wikitext-103-raw-v1"
    D.load_data(DataConfig(source="hf", dataset="wikitext:wikitext-103-raw-v1"))
    assert len(calls) == 1  # served from the memmap cache the second time
    assert "HF_DATASETS_OFFLINE" not in __import__("os").environ  # restored


def test_hugging_face_without_datasets_is_a_clear_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(D.DataUnavailable, match="needs the `datasets` package"):
        D.load_data(DataConfig(source="hf", dataset="wikitext"))


def test_cli_missing_dataset_is_one_line(monkeypatch, tmp_path):
    import sys

    from typer.testing import CliRunner

    from posenc.cli import app

    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))
    monkeypatch.setitem(sys.modules, "datasets", None)
    r = CliRunner().invoke(app, ["lab", "--dataset", "wikitext", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "needs the `datasets` package" in r.output
    assert "Traceback" not in r.output
