"""``python -m posenc.lmeval ...``: lm-eval's command line with the ``posenc`` model registered
(:mod:`posenc.lmeval.launcher`); ``accelerate launch -m posenc.lmeval ...`` for data parallel."""

from __future__ import annotations

from .launcher import main

if __name__ == "__main__":
    main()
