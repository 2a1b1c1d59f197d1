"""The run machinery that ``posenc lab``, ``posenc extend`` and the benches share, below all of
them (it imports none of them): the append-only result store and the schema its rows are read
by, the folder lock, study identity (stable hashes, posenc's source hash), atomic saves,
progress bars, per-step metrics and TensorBoard, terminal tables, strict JSON.

Modules: :mod:`~posenc.runs.store`, :mod:`~posenc.runs.rows`, :mod:`~posenc.runs.lock`,
:mod:`~posenc.runs.identity`, :mod:`~posenc.runs.atomic`, :mod:`~posenc.runs.progress`,
:mod:`~posenc.runs.metrics`, :mod:`~posenc.runs.term_table`, :mod:`~posenc.runs.strict_json`.
"""
