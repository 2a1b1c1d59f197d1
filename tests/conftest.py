import os

import pytest
import torch

# Two workers on a 2-core machine: one intra-op thread each keeps them from fighting.
torch.set_num_threads(int(os.environ.get("POSENC_TEST_THREADS", "1")))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
