"""Fallback matching: a precomputed index of the known tags, and the route-time lookup.

A :class:`FallbackMatcher` builds a :class:`MatchIndex` from the tags the gateway knows (and
the texts that describe them); building may be slow or asynchronous (an embedding model
encoding every tag's text), so it happens off the request path, when the known tags change.
The route-time lookup, :meth:`MatchIndex.scores`, is a fast pure function of the index.

Invariants:
- The router reads :attr:`MatchIndexHolder.index` and never builds. A change of the known tags
  schedules one build (changes in a burst share it); a build started before a later change
  never replaces the index of that later change (builds are versioned).
- Until the first build finishes the index is empty: no fallback match, only exact ones.
- A failing build is logged and the previous index stays in force.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Protocol

from agent_reach.observability.logs import log

__all__ = ["EMPTY_INDEX", "FallbackMatcher", "MatchIndex", "MatchIndexHolder", "TagTexts"]

# the texts describing a tag (agents' descriptions; a dictionary's description and examples)
TagTexts = Callable[[str], Sequence[str]]


class MatchIndex(Protocol):
    """What a matcher built from the known tags; read at route time."""

    def scores(self, intent: str, text: str | None = None) -> dict[str, float]:
        """Confidence in ``[0, 1]`` for each known tag that relates to the requested
        ``intent`` (or to the caller's words ``text``, when given). Tags with no relation may
        be left out. Pure, deterministic and fast: it runs on the request path."""
        ...


class FallbackMatcher(Protocol):
    """Builds the index fallback matches are looked up in."""

    def build(self, known: Collection[str], texts: TagTexts) -> MatchIndex | Awaitable[MatchIndex]:
        """The index of the tags ``known``; ``texts(tag)`` gives the texts describing one.

        May return the index, or an awaitable of it when building needs async work (it then
        runs as a task, off every request). Must not keep a reference to ``known``.
        """
        ...


class _EmptyIndex:
    def scores(self, intent: str, text: str | None = None) -> dict[str, float]:
        return {}


EMPTY_INDEX: MatchIndex = _EmptyIndex()


class MatchIndexHolder:
    """The current index of one matcher, rebuilt when :meth:`changed` says the tags changed.

    ``known`` and ``texts`` read the gateway's current tags (the registry's view, and a
    dictionary once there is one); ``on_swap`` runs after a new index is in force (the router
    drops its cached fallback answers). Builds run on the event loop that calls
    :meth:`changed`: a synchronous build in a callback of its own (soon, not inside the
    registry's listener), an asynchronous one as a task.
    """

    def __init__(
        self,
        matcher: FallbackMatcher,
        known: Callable[[], Collection[str]],
        texts: TagTexts,
        on_swap: Callable[[], None] = lambda: None,
    ) -> None:
        self.matcher = matcher
        self.index: MatchIndex = EMPTY_INDEX
        self._known = known
        self._texts = texts
        self._on_swap = on_swap
        self._version = 0  # bumped by every change
        self._built = -1  # the version of the index in force
        self._scheduled = False
        self._task: asyncio.Task[None] | None = None

    def build_now(self) -> None:
        """Build at once, synchronously (start-up, tests); an async build is awaited by
        :meth:`wait` instead."""
        self._scheduled = False
        version = self._version
        try:
            result = self.matcher.build(tuple(self._known()), self._texts)
        except Exception:  # the old index stays; the next change tries again
            log(logging.ERROR, "intents.index_failed", exc_info=True)
            return
        if inspect.isawaitable(result):
            self._task = asyncio.ensure_future(self._finish(version, result))
            return
        self._swap(version, result)

    def changed(self) -> None:
        """The known tags (or their texts) changed: schedule one rebuild."""
        self._version += 1
        if self._scheduled:
            return
        self._scheduled = True
        try:
            asyncio.get_running_loop().call_soon(self.build_now)
        except RuntimeError:  # no loop (a synchronous caller, a test): build here
            self.build_now()

    async def wait(self) -> None:
        """Until a build of the latest change has ended (for start-up and tests); when it
        failed, the previous index stays in force (logged)."""
        if self._built == self._version:
            return
        if self._task is None or self._task.done():
            self.build_now()
        if self._task is not None and not self._task.done():
            await self._task

    async def _finish(self, version: int, pending: Awaitable[MatchIndex]) -> None:
        try:
            index = await pending
        except asyncio.CancelledError:
            raise
        except Exception:  # the old index stays; the next change tries again
            log(logging.ERROR, "intents.index_failed", exc_info=True)
            return
        self._swap(version, index)

    def _swap(self, version: int, index: MatchIndex) -> None:
        if version < self._built:
            return  # an older build finished late: the newer index stays
        self.index, self._built = index, version
        self._on_swap()

    def close(self) -> None:
        """Cancel a build in progress."""
        if self._task is not None:
            self._task.cancel()
