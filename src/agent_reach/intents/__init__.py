"""Intents beyond the exact tag: fallback matchers and the index they route from.

The tag grammar itself is pure and lives in :mod:`agent_reach.core.names`. Here:
:mod:`.matcher` (the protocols and the index kept off the request path) and :mod:`.lexical`
(the default matcher today: shared leading segments). A dictionary and a semantic matcher
(embeddings behind an Embedder protocol) plug in here next.
"""

from agent_reach.intents.lexical import SegmentPrefixMatcher
from agent_reach.intents.matcher import FallbackMatcher, MatchIndex, MatchIndexHolder

__all__ = ["FallbackMatcher", "MatchIndex", "MatchIndexHolder", "SegmentPrefixMatcher"]
