"""Benchmarks behind ``posenc bench``: :mod:`.cli` (the commands), :mod:`.harness` (timing and
reports), one module per subject (:mod:`.rope`, :mod:`.cos_sin`, :mod:`.bias`, :mod:`.hf_model`).
A run's figures are rows (:mod:`.rows`, JSON), its ``benchmarks/RESULTS.md`` block is rendered
from them (:mod:`.render`) and its targets are judged from them (:mod:`.targets`). Imports stay
light here so that ``posenc --help`` does not load torch."""
