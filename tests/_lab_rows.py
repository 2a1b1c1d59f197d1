"""A lab grid's result row in the store's format, with made-up numbers, for the tests of the
report, the paired comparisons and the seeds' intervals."""

from __future__ import annotations

from collections.abc import Sequence


def fake_row(
    encoding: str,
    seed: int,
    bits: dict[str, dict[int, list[float]]],
    labels: dict[str, str],
    lengths: Sequence[int],
) -> dict:
    """One row (the fields the report and plots read) of a one-layer model trained at 16 bytes:
    ``bits[variant][length][seed]`` the bits per byte of each variant (``labels[variant]`` its
    label) at each length."""
    variants = {
        vname: {
            "label": labels[vname],
            "results": {
                str(n): {"bits": values[seed], "acc": None, "tokens": 64, "note": None}
                for n, values in per_len.items()
            },
        }
        for vname, per_len in bits.items()
    }
    model = {"dim": 32, "num_layers": 1, "num_heads": 2}
    train = {"steps": 2, "batch_size": 4}
    return {
        "encoding": encoding, "encoding_kwargs": {}, "seed": seed, "config_hash": f"h{seed}",
        "group": "g0", "preset": "test", "train_len": 16, "params": 1000,
        "data": {"name": "copy", "fingerprint": "f0", "unit": "byte"},
        "identity": {"train": {"model": model, "train": train}},
        "train": {"tokens_per_s": 1e4, "tokens_per_s_fast": 1.1e4, "final_loss_bits": 3.0,
                  "train_seconds": 1.0},
        "eval": {"unit": "byte", "mode": "sliding", "lengths": list(lengths),
                 "variants": variants},
        "runtime": {"cell_seconds": 1.0, "threads": 1, "device": "cpu", "world_size": 1},
        "versions": {"torch": "x"},
    }  # fmt: skip
