"""The passkey task of posenc.lab.evaluation.tasks (layout, depth, determinism), its length x depth heatmap
in posenc.lab.evaluation.evaluate, and the heatmap figure (posenc.plots.passkey)."""

from __future__ import annotations

import hashlib

import pytest
import torch
from torch import nn

from posenc import registry
from posenc.lab.cells.presets import EvalConfig, TrainConfig
from posenc.lab.evaluation import evaluate as E
from posenc.lab.evaluation import tasks as T
from posenc.lab.training.data import IGNORE
from posenc.model import ModelConfig


def _layout(x: torch.Tensor, y: torch.Tensor, d: int) -> dict[str, int]:
    """Check one row's layout field by field; returns where the key sits."""
    s = x.shape[0]
    seq = torch.cat([x, y[-1:]]).tolist()  # the s + 1 tokens
    assert seq[0] == T.BOS
    assert seq.count(T.KEY) == 1 and seq.count(T.QUERY) == 1
    at = seq.index(T.KEY)
    key = seq[at + 1 : at + 1 + d]
    assert all(t in T.DIGITS for t in key)
    assert seq[s - d] == T.QUERY  # QUERY, then the key again, ends the sequence
    assert seq[s - d + 1 :] == key
    filler = seq[1:at] + seq[at + 1 + d : s - d]
    assert all(t in T.FILLER for t in filler)
    assert len(filler) == s + 1 - 3 - 2 * d  # BOS, KEY, QUERY, the key twice
    # Only the digits after QUERY are targets; they are the key.
    scored = [i for i, t in enumerate(y.tolist()) if t != IGNORE]
    assert scored == list(range(s - d, s))
    assert y[scored].tolist() == key
    return {"at": at, "filler": len(filler)}


@pytest.mark.parametrize("digits", [1, 2, 5])
@pytest.mark.parametrize("seq_len", [16, 64, 100])
def test_layout_and_depth(digits, seq_len):
    task = T.make_task("passkey", digits=digits)
    depths = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0]
    x, y = task.sample(torch.Generator().manual_seed(3), len(depths), seq_len, depth=depths)
    assert x.shape == y.shape == (len(depths), seq_len)
    for row, depth in enumerate(depths):
        got = _layout(x[row], y[row], digits)
        # The KEY marker follows BOS and round(depth * F) filler tokens (F: every filler token).
        assert got["at"] == 1 + round(depth * got["filler"])
    assert x[0, 1] == T.KEY and x[-1, seq_len - 2 * digits - 1] == T.KEY  # depth 0 and 1
    assert task.depth_index(x[[0, 2, 3, 4, 6]]).tolist() == [0, 1, 2, 3, 4]
    one, _ = task.sample(torch.Generator().manual_seed(3), 4, seq_len, depth=0.5)
    assert ((one == T.KEY).int().argmax(1) == 1 + round(0.5 * (seq_len - 2 - 2 * digits))).all()


def test_training_depth_is_uniform_over_every_slot():
    task = T.make_task("passkey")
    x, y = task.sample(torch.Generator().manual_seed(0), 4000, 24)
    at = (x == T.KEY).int().argmax(1)
    fill = 24 + 1 - 3 - 2 * task.digits
    counts = torch.bincount(at - 1, minlength=fill + 1)
    assert len(counts) == fill + 1 and (counts > 0).all()  # 0..F filler tokens before KEY
    assert counts.float().std() / counts.float().mean() < 0.2
    for row in range(5):
        _layout(x[row], y[row], task.digits)


def test_deterministic_and_fixed_evaluation_set():
    task = T.make_task("passkey")
    a = task.train_batch(7, 16, 64, seed=1)
    b = task.train_batch(7, 16, 64, seed=1)
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    assert not torch.equal(a[0], task.train_batch(8, 16, 64, seed=1)[0])
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(task.sample(g1, 3, 40, 0.3)[0], task.sample(g2, 3, 40, 0.3)[0])
    windows = list(task.eval_windows(64, 64 * 1000))
    again = list(task.eval_windows(64, 64 * 1000))
    assert all(torch.equal(p[0], q[0]) for p, q in zip(windows, again, strict=True))
    x = torch.cat([w[0] for w in windows])
    assert x.shape[0] == 1000  # 200 per depth: the budget, already a multiple of 5
    assert torch.bincount(task.depth_index(x)).tolist() == [200] * 5
    # At long lengths the budget would leave a few per depth: PASSKEY_MIN_PER_DEPTH each.
    x = torch.cat([w[0] for w in task.eval_windows(512, 4096)])
    want = T.PASSKEY_MIN_PER_DEPTH
    assert torch.bincount(task.depth_index(x)).tolist() == [want] * len(T.PASSKEY_DEPTHS)


def test_existing_tasks_are_unchanged():
    """The outputs of copy, reverse and associative recall as they were before the passkey task
    (hashes taken from the commit before it), and their fingerprints (part of every cell hash)."""
    want = {
        "copy": "a81b94e365f755a9",
        "reverse": "2beee194c0dacbd3",
        "associative-recall": "b50f879b6107d29a",
    }
    for name, digest in want.items():
        task = T.make_task(name)
        x, y = task.train_batch(3, 8, 40, seed=1)
        ev = [t for xy in task.eval_windows(24, 24 * 7) for t in xy]
        blob = b"".join(t.numpy().tobytes() for t in [x, y, *ev])
        assert hashlib.sha256(blob).hexdigest()[:16] == digest, name
        assert task.fingerprint == f"task-{name}-v1"
        with pytest.raises(ValueError, match="passkey task only"):
            task.sample(torch.Generator(), 1, 16, depth=0.5)
    assert "passkey" in T.TASKS
    assert T.make_task("passkey").fingerprint != T.make_task("passkey", digits=3).fingerprint


def test_bad_arguments():
    task = T.make_task("passkey", digits=5)
    with pytest.raises(ValueError, match="at least 12 tokens"):
        task.sample(torch.Generator(), 1, 11)
    task.sample(torch.Generator(), 1, 12)  # no filler at all still works
    with pytest.raises(ValueError, match=r"depth must be in \[0, 1\]"):
        task.sample(torch.Generator(), 2, 32, depth=1.5)
    with pytest.raises(ValueError, match="digits must be a positive integer"):
        T.make_task("passkey", digits=0)
    with pytest.raises(ValueError, match="passkey task only"):
        T.make_task("copy", digits=2)


# --- the heatmap in evaluate_model ---------------------------------------------------------


class Copier(nn.Module):
    """Reads the key after KEY and predicts it after QUERY (one-hot logits), except for rows
    whose key sits at depth 0 when ``blind_at_start`` (there it predicts the wrong digit)."""

    def __init__(self, blind_at_start: bool = False, digits: int = T.PASSKEY_DIGITS):
        super().__init__()
        self.blocks = nn.ModuleList()  # no attention layers: no rotary variants
        self.blind, self.d = blind_at_start, digits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape
        logits = torch.zeros(b, s, 256)
        for r in range(b):
            at = int((x[r] == T.KEY).nonzero()[0, 0])
            key = x[r, at + 1 : at + 1 + self.d]
            if self.blind and at == 1:
                key = T.DIGITS.start + (key - T.DIGITS.start + 1) % len(T.DIGITS)
            logits[r, torch.arange(s - self.d, s), key] = 30.0  # [d] answer positions
        return logits


def test_a_perfect_copier_scores_one_everywhere_and_depth_is_binned():
    task = T.make_task("passkey")
    cfg = EvalConfig(tokens=16 * 40, batch_tokens=16 * 16)
    out = E.evaluate_model(Copier(), task, 16, [16, 32, 64], cfg)
    pk = out["variants"]["base"]["passkey"]
    assert pk["depths"] == list(T.PASSKEY_DEPTHS) and pk["lengths"] == [16, 32, 64]
    assert pk["acc"] == [[1.0] * 5] * 3 and pk["exact"] == [[1.0] * 5] * 3
    assert pk["sequences"] == [[T.PASSKEY_MIN_PER_DEPTH] * 5] * 3
    assert out["variants"]["base"]["results"]["16"]["acc"] == 1.0
    assert "passkey" not in out["variants"]["base"]["results"]["16"]  # only the matrix
    blind = E.evaluate_model(Copier(blind_at_start=True), task, 16, [16, 32], cfg)
    pk = blind["variants"]["base"]["passkey"]
    assert pk["acc"] == [[0.0, 1.0, 1.0, 1.0, 1.0]] * 2  # depth 0 is the first column
    assert pk["exact"] == [[0.0, 1.0, 1.0, 1.0, 1.0]] * 2
    assert blind["variants"]["base"]["results"]["32"]["acc"] == pytest.approx(0.8)


@pytest.mark.skipif("rope" not in registry.names(), reason="rope is not registered")
def test_heatmap_of_a_tiny_trained_rope_model_for_every_variant():
    from posenc.lab.training.train import train_model

    task = T.make_task("passkey")
    mcfg = ModelConfig(vocab_size=256, dim=32, num_layers=1, num_heads=2, max_len=16,
                       encoding="rope")  # fmt: skip
    tcfg = TrainConfig(steps=3, batch_size=4, warmup_steps=1)
    model = train_model(mcfg, tcfg, task, seed=0, identity={}, ckpt_dir=None).model
    cfg = EvalConfig(tokens=16 * 10, batch_tokens=256, rope_scalings=("linear", "yarn"))
    out = E.evaluate_model(model, task, 16, [16, 32], cfg)
    assert set(out["variants"]) == {"base", "linear", "yarn"}
    for name, v in out["variants"].items():
        pk = v["passkey"]
        assert set(pk) == {"depths", "lengths", "acc", "exact", "sequences"}
        assert len(pk["acc"]) == 2 and all(len(r) == 5 for r in pk["acc"])
        assert all(0.0 <= a <= 1.0 for r in pk["acc"] + pk["exact"] for a in r)
        for n, row, seqs in zip(pk["lengths"], pk["acc"], pk["sequences"], strict=True):
            # The heatmap splits the length's answer-token accuracy by depth.
            mean = sum(a * c for a, c in zip(row, seqs, strict=True)) / sum(seqs)
            assert mean == pytest.approx(v["results"][str(n)]["acc"])
        if name != "base":  # factor 1 at L: the variant is the base model there
            assert pk["acc"][0] == out["variants"]["base"]["passkey"]["acc"][0]


def test_non_passkey_data_has_no_heatmap():
    class Uniform(nn.Module):
        blocks = nn.ModuleList()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.zeros(*x.shape, 256)

    out = E.evaluate_model(Uniform(), T.make_task("copy"), 16, [16], EvalConfig(tokens=64))
    assert "passkey" not in out["variants"]["base"]


# --- the figure ----------------------------------------------------------------------------


def _row(encoding: str, seed: int, value: float, variants: tuple[str, ...] = ()) -> dict:
    lengths = [64, 128]

    def heat(v: float) -> dict:
        return {"depths": list(T.PASSKEY_DEPTHS), "lengths": lengths,
                "acc": [[v] * 5, [None] * 5 if encoding == "learned" else [v / 2] * 5],
                "exact": [[v] * 5, [v / 4] * 5], "sequences": [[32] * 5] * 2}  # fmt: skip

    vs = {"base": {"label": "", "results": {}, "passkey": heat(value)}}
    for name in variants:
        vs[name] = {"label": name.upper(), "results": {}, "passkey": heat(value / 2)}
    return {"encoding": encoding, "seed": seed, "train_len": 64,
            "eval": {"lengths": lengths, "variants": vs}}  # fmt: skip


def test_passkey_figure_from_fake_rows(tmp_path):
    pytest.importorskip("matplotlib")
    from posenc.plots import passkey as P
    from posenc.plots.common import caption

    rows = [
        _row("rope", 0, 0.2, ("linear", "yarn")),
        _row("rope", 1, 0.4, ("linear", "yarn")),
        _row("alibi", 0, 1.0),
        _row("learned", 0, 0.9),
        {"encoding": "text", "seed": 0, "train_len": 64,
         "eval": {"lengths": [64], "variants": {"base": {"label": "", "results": {}}}}},
    ]  # fmt: skip
    data = P.passkey_data(rows)
    assert data["lengths"].tolist() == [64, 128] and data["train_len"] == 64
    labels = [p["label"] for p in data["panels"]]
    assert labels == ["rope", "rope + LINEAR", "rope + YARN", "alibi", "learned"]
    rope = data["panels"][0]
    assert rope["seeds"] == 2 and rope["acc"].shape == (5, 2)  # [depth, length]
    assert rope["acc"][:, 0] == pytest.approx([0.3] * 5)  # mean over the seeds
    assert rope["acc"][:, 1] == pytest.approx([0.15] * 5)
    learned = data["panels"][-1]["acc"]
    assert learned[:, 0] == pytest.approx([0.9] * 5) and all(v != v for v in learned[:, 1])

    lost = {x["label"]: x for x in P.passkey_lost_at(data, threshold=0.9)}
    assert lost["alibi"]["learned"] and lost["alibi"]["lost_at"] == 128  # 0.5 at 2L
    assert not lost["rope"]["learned"] and lost["rope"]["lost_at"] == 64  # 0.3 at L
    assert lost["learned"]["lost_at"] == 128  # not applicable past its table
    assert lost["alibi"]["mean"].tolist() == pytest.approx([1.0, 0.5])
    assert P.passkey_lost_at(data, threshold=0.5)[3]["lost_at"] is None  # alibi holds
    fig = P.draw_passkey(data)
    heatmaps = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title() for ax in heatmaps] == ["rope (2 seeds)", "alibi", "learned"]
    assert "training length" in caption(fig) and "YaRN" in caption(fig)
    texts = {t.get_text() for t in heatmaps[1].texts}
    assert texts == {"1", ".50"}  # the number in every cell (1.00 and 0.50, compact)
    fig = P.draw_passkey(data, variants=True)
    titles = [ax.get_title() for ax in fig.axes if ax.images]
    assert titles == ["rope (2 seeds)", "rope + LINEAR (2 seeds)", "rope + YARN (2 seeds)"]
    path = P.write_passkey_figure(rows, tmp_path / "pk.png")
    assert path.stat().st_size > 1000
    with pytest.raises(ValueError, match="no passkey heatmaps"):
        P.passkey_data(rows[-1:])


def test_heatmap_settings_enter_the_passkey_cells_hash_only():
    from dataclasses import replace as _replace

    from posenc.lab.cells import presets as P
    from posenc.lab.evaluation.tasks import PASSKEY_DEPTHS, PASSKEY_MIN_PER_DEPTH

    passkey = _replace(P.LabConfig(), data=P.DataConfig(source="task", task="passkey"))
    copy = _replace(P.LabConfig(), data=P.DataConfig(source="task", task="copy"))
    assert P.eval_identity(passkey)["passkey"] == {
        "depths": list(PASSKEY_DEPTHS),
        "min_per_depth": PASSKEY_MIN_PER_DEPTH,
    }
    assert "passkey" not in P.eval_identity(copy)
    assert "passkey" not in P.eval_identity(P.LabConfig())


def test_readme_passkey_block_says_where_each_encoding_loses_the_key(tmp_path):
    from posenc.lab.reports.readme import write_readme_table

    rows = [_row("alibi", 0, 1.0), _row("rope", 0, 0.95)]
    for r in rows:
        r["data"] = {"fingerprint": "task-passkey-d2-f32-v1"}
    readme = tmp_path / "R.md"
    readme.write_text("intro\n<!-- lab:passkey -->\nold\n<!-- /lab:passkey -->\nend\n")
    write_readme_table(readme, rows)
    text = readme.read_text()
    assert "old" not in text and text.startswith("intro\n") and text.endswith("end\n")
    table = {
        line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")
    }
    # alibi: 1.0 at L, 0.5 at 2L -> lost at 128; rope: 0.95 at L, 0.475 -> lost at 128 too.
    assert table["alibi"].replace(" ", "") == "|alibi|1.00|0.50|128|"
    assert table["rope"].replace(" ", "") == "|rope|0.95|0.47|128|"
    assert "chance 0.10" in text
