import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

# Two workers on a 2-core machine: one intra-op thread each keeps them from fighting.
torch.set_num_threads(int(os.environ.get("POSENC_TEST_THREADS", "1")))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def write_corpus() -> Callable[..., Path]:
    """``write_corpus(folder, limit=None)``: ``folder/corpus`` filled with real text, the source
    files of ``posenc.lab`` and its stage packages (the first ``limit`` in path order, each
    named by its path), for the lab's byte-level runs."""
    import posenc.lab

    def write(folder: Path, limit: int | None = None) -> Path:
        d = folder / "corpus"
        d.mkdir()
        root = Path(posenc.lab.__file__).parent
        for f in sorted(root.rglob("*.py"))[:limit]:
            (d / "_".join(f.relative_to(root).parts)).write_bytes(f.read_bytes())
        return d

    return write
