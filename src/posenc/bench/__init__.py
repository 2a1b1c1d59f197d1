"""Benchmarks behind ``posenc bench``: :mod:`.cli` (the commands), :mod:`.harness` (timing and
reports), one module per subject (:mod:`.rope`, :mod:`.cos_sin`). Imports stay light here so that
``posenc --help`` does not load torch."""
