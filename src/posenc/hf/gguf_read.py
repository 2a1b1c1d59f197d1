"""Reading a GGUF file once, and quickly, while transformers loads from it.

transformers builds a new ``gguf.GGUFReader`` for each read of a GGUF file's metadata or weights:
three per load of SmolLM2 at 5.24 (the tokenizer's config, the model's config, the weights), four
at 4.56. Each parses every field element by element, a numpy view of the file per element: ~4 s
for SmolLM2's 49K-token vocabulary on one core here, 13-17 s for Gemma-3's 262K. It also builds
gguf's tensor-name map once per submodule of the model (397 times for SmolLM2, ~6 s).

:func:`gguf_read_once` makes one reader per file and one name map per architecture serve the whole
load (both are only read from; the file is mapped read-only), and each reader takes its views of
a plain array over the file's map rather than of the ``numpy.memmap`` (whose Python-level
``__getitem__`` and ``__array_finalize__`` were two thirds of the parse): the same fields, the
same bytes, Gemma-3-270M's metadata in 4.2 s instead of 12.7 s (tests/test_gguf_read.py compares
every field and tensor with the stock reader's). transformers' own vocabulary reader is not one of
them and runs as before.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# One GGUF load at a time shares gguf's names (another thread's load waits for it).
_GGUF_LOCK = threading.RLock()
#: The parameters of ``GGUFReader._get`` that :func:`fast_reader` overrides (gguf 0.10-0.19;
#: tests/test_gguf_read.py compares every field and tensor with the installed gguf's reader).
_GET_PARAMS = ["self", "offset", "dtype", "count", "override_order"]


@contextmanager
def gguf_read_once() -> Iterator[None]:
    """One fast ``gguf.GGUFReader`` per file (:func:`fast_reader`), and one tensor-name map per
    architecture, while inside. transformers imports the names inside its functions
    (``from gguf import GGUFReader``), so they are replaced where they are looked up, and restored
    on the way out; loads in other threads wait for the lock. Without gguf, nothing changes
    (transformers says that GGUF files need it)."""
    try:
        import gguf
    except ImportError:
        yield
        return
    with _GGUF_LOCK:
        names = [n for n in ("GGUFReader", "get_tensor_name_map") if hasattr(gguf, n)]
        originals = {n: getattr(gguf, n) for n in names}
        for name, fn in originals.items():
            setattr(gguf, name, _memoized(fast_reader(fn) if name == "GGUFReader" else fn))
        try:
            yield
        finally:
            for name, fn in originals.items():
                setattr(gguf, name, fn)


def fast_reader(reader: Any) -> Any:
    """A subclass of the ``GGUFReader`` class ``reader`` whose element views come from a plain
    ``numpy.ndarray`` over the file's map; ``reader`` itself where its ``_get`` is not the one
    this overrides (another gguf version: slower, never different)."""
    get = getattr(reader, "_get", None)
    try:
        params = list(inspect.signature(get).parameters) if get is not None else None
    except (TypeError, ValueError):
        params = None
    if not isinstance(reader, type) or params != _GET_PARAMS:
        return reader

    import numpy as np

    class FastGGUFReader(reader):  # type: ignore[misc, valid-type]
        def _get(
            self, offset: int, dtype: Any, count: int = 1, override_order: str | None = None
        ) -> Any:
            # as gguf's own _get, on an ndarray view of self.data (the memmap): the same bytes
            plain = self.__dict__.get("_plain_data")
            if plain is None or plain.shape != self.data.shape:
                plain = self.__dict__["_plain_data"] = self.data.view(np.ndarray)
            count = int(count)
            itemsize = np.dtype(dtype).itemsize
            arr = plain[offset : offset + itemsize * count].view(dtype=dtype)[:count]
            order = self.byte_order if override_order is None else override_order
            return arr.view(arr.dtype.newbyteorder(order))

    FastGGUFReader.__qualname__ = FastGGUFReader.__name__ = f"Fast{reader.__name__}"
    return FastGGUFReader


def _memoized(fn: Any) -> Any:
    """``fn`` called once per distinct arguments (paths by their text); arguments that cannot
    be a key call ``fn`` every time."""
    made: dict[tuple, Any] = {}

    def text(a: Any) -> Any:
        return os.fspath(a) if isinstance(a, os.PathLike) else a

    def call(*args: Any, **kwargs: Any) -> Any:
        key = (tuple(map(text, args)), tuple(sorted((k, text(v)) for k, v in kwargs.items())))
        try:
            hash(key)
        except TypeError:  # an unhashable argument: no sharing
            return fn(*args, **kwargs)
        if key not in made:
            made[key] = fn(*args, **kwargs)
        return made[key]

    return call
