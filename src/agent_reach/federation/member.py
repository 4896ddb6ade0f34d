"""A gateway's membership of a federation: publish its summary to the directory, keep the other
domains' summaries, measure the round trip to their gateways (docs/federation.md).

Every ``--summary-interval`` seconds :class:`Membership` publishes this domain's summary
(``PUT DIRECTORY/v1/summaries/DOMAIN``), takes the others' from the answer into
:class:`~agent_reach.federation.peers.Peers`, and probes each fresh peer's ``/healthz``: the
round trip orders forwarding candidates, and a probe that fails marks the peer unreachable
until one answers.

Invariants:
- The directory away changes nothing but the ages: the peers' last summaries are used until
  they are stale (3 intervals), and the loop goes on trying; its state changes are logged once
  each (``federation.directory_unreachable``, ``federation.directory_back``), not every round.
- A summary the directory refuses (its bounds, a token, its bound on domains) does not cost
  the others': they are read with ``GET /v1/summaries`` (``federation.summary_refused``). The
  summary is cut to what a directory takes first (:func:`~.summary.trim_summary`).
- Nothing here decides a route: forwarding is the gateway's (:mod:`agent_reach.gateway.forward`).
- The loop catches per round, logs, and lets cancellation pass; every call is bounded in time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
import msgspec

from agent_reach.clock import Clock
from agent_reach.federation.peers import Peers
from agent_reach.federation.summary import trim_summary
from agent_reach.observability.logs import Throttle, log
from agent_reach.transport.http import Fetched
from agent_reach.wire.federation import DirectoryEntry, DomainSummary

__all__ = ["STALE_INTERVALS", "Membership"]

STALE_INTERVALS = 3  # a summary older than this many intervals is not used (CONTRACT.md)
KEEP_INTERVALS = 20  # ... and forgotten past this many (shown as stale until then)
MAX_DIRECTORY_ANSWER_BYTES = 64 << 20  # a directory answer read at most
PROBE_TIMEOUT_S = 1.0


class _RawAnswer(msgspec.Struct):
    """A :class:`~agent_reach.wire.federation.DirectoryAnswer` whose summaries are decoded
    later, one at a time."""

    summaries: list[msgspec.Raw]


_raw_answer = msgspec.json.Decoder(_RawAnswer)
_entry_decoder = msgspec.json.Decoder(DirectoryEntry)
_encode = msgspec.json.Encoder().encode


class Membership:
    """This gateway in the federation of ``directory``: its loop and what it learnt."""

    def __init__(
        self,
        domain: str,
        directory: str,
        interval_s: float,
        clock: Clock,
        summarize: Callable[[str], DomainSummary],
        *,
        token: Callable[[], str | None] = lambda: None,
        on_peers_changed: Callable[[], None] = lambda: None,
        on_published: Callable[[bool], None] = lambda ok: None,
        fetch: Callable[[str, Mapping[str, str], float], Awaitable[Fetched]] | None = None,
    ) -> None:
        self.domain = domain
        self.directory = directory.rstrip("/")
        self.interval_s = interval_s
        self.clock = clock
        self.peers = Peers(domain, STALE_INTERVALS * interval_s)
        self._summarize = summarize
        self._token = token
        self._on_peers_changed = on_peers_changed
        self._on_published = on_published
        self._fetch = fetch  # the gateway's guarded GET (probes, trace reads)
        self.gateway_url: str | None = None  # set once the gateway listens (serving())
        self._served = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None
        self.directory_ok: bool | None = None  # None: not tried yet
        self.directory_error = ""
        self.published_at: float | None = None  # monotonic time of the last publication
        self.last_summary: DomainSummary | None = None
        self.publish_ms: float | None = None  # what building and sending the last one took
        self.summary_bytes = 0
        self.intents_left_out = 0  # tags the last summary left out (trim_summary)
        self._trims = Throttle(every_s=60.0, monotonic=clock.monotonic)

    def serving(self, url: str) -> None:
        """The gateway listens at ``url`` (or the --advertise-url it was given)."""
        if self.gateway_url is None:
            self.gateway_url = url.rstrip("/")
        self._served.set()

    def headers(self) -> dict[str, str]:
        token = self._token()
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def start(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64, limit_per_host=4),
                timeout=aiohttp.ClientTimeout(total=None),
            )

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # --- the loop --------------------------------------------------------------------------

    async def run(self) -> None:
        """Publish, take the others', probe; a round every interval (counted from the start
        of the last, so a slow directory or peer does not stretch the cadence) until
        cancelled. The probes run beside the rounds: a peer that does not answer delays no
        publication (one probe round at a time)."""
        await self._served.wait()
        probing: asyncio.Task[None] | None = None
        next_at = self.clock.monotonic()
        try:
            while True:
                try:
                    await self.publish()
                    if probing is None or probing.done():
                        probing = asyncio.create_task(self.probe(), name="agent-reach-probes")
                except asyncio.CancelledError:
                    raise
                except Exception:  # a bug must not end the loop: the next round tries again
                    log(logging.ERROR, "federation.round_error", exc_info=True)
                now = self.clock.monotonic()
                next_at = max(next_at + self.interval_s, now)
                await self.clock.sleep(next_at - now)
        finally:
            if probing is not None:
                probing.cancel()

    async def publish(self) -> bool:
        """One publication: the summary out, the others' in. Whether the directory took this
        domain's summary. When it answers but refuses it (over its bounds, its store full, a
        token it does not take), the others' are read all the same (``GET /v1/summaries``):
        this domain goes on forwarding to them while it cannot be forwarded to."""
        assert self._session is not None and self.gateway_url is not None
        started = self.clock.monotonic()
        summary, left_out = trim_summary(self._summarize(self.gateway_url))
        if left_out:  # at most a line a minute: the count moves with the tags' health
            self._trims.log(
                logging.WARNING,
                "federation.summary_trimmed",
                left_out=left_out,
                published=len(summary.intents),
                note="the tags with the fewest healthy endpoints are left out of the summary:"
                " a directory refuses a summary over its bounds whole",
            )
        self.intents_left_out = left_out
        body = _encode(summary)
        self.last_summary, self.summary_bytes = summary, len(body)
        url = f"{self.directory}/v1/summaries/{self.domain}"
        status, data, error = await self._call("PUT", url, body)
        entries: list[DirectoryEntry] | None = None
        if status == 200:
            entries, error = await _entries(data)
        refused = status is not None and status != 200 and _refused_summary(status, data)
        if status is not None and status != 200:
            error = f"HTTP {status}: {_detail(data)}"
            if refused:
                got, data, why = await self._call("GET", f"{self.directory}/v1/summaries", None)
                if got == 200:
                    entries, why = await _entries(data)
                elif got is not None:
                    why = f"HTTP {got}: {_detail(data)}"
                error += (
                    "; the others' summaries were read (GET /v1/summaries)"
                    if entries is not None
                    else f"; reading the others' failed too: {why}"
                )
        now = self.clock.monotonic()
        self.publish_ms = round((now - started) * 1000.0, 3)
        taken = status == 200 and entries is not None
        before = self.peers.version
        if entries is not None:
            self.peers.update(entries, now)
        if taken:
            self.published_at = now
        self._directory_state(taken, error, refused=refused)
        self._on_published(taken)
        gone = self.peers.drop_stale(now, KEEP_INTERVALS * self.interval_s)
        for domain in gone:
            log(logging.INFO, "federation.peer_forgotten", domain=domain)
        if self.peers.version != before:
            self._on_peers_changed()
        return taken

    async def _call(
        self, method: str, url: str, body: bytes | None
    ) -> tuple[int | None, bytes, str]:
        """One call to the directory, bounded by the round's cadence: (its status, or None
        when it did not answer; its body, at most MAX_DIRECTORY_ANSWER_BYTES + 1; why it failed)."""
        assert self._session is not None
        timeout = min(max(0.25, self.interval_s), 10.0)
        headers = {"Content-Type": "application/json", **self.headers()}
        try:
            async with asyncio.timeout(timeout):
                resp = await self._session.request(
                    method, url, data=body, headers=headers, allow_redirects=False
                )
                async with resp:
                    return resp.status, await _read_capped(resp), ""
        except TimeoutError:
            return None, b"", f"no answer within {timeout:g} s"
        except aiohttp.ClientError as exc:
            return None, b"", f"cannot reach it: {exc}"

    def _directory_state(self, ok: bool, error: str, *, refused: bool = False) -> None:
        """Log a change of the directory's state once: back, unreachable (or answering what
        this gateway cannot use), or (``refused``) refusing this domain's summary."""
        if ok and self.directory_ok is not True:
            log(logging.INFO, "federation.directory_back", directory=self.directory)
        elif not ok and (self.directory_ok is not False or error != self.directory_error):
            log(
                logging.WARNING,
                "federation.summary_refused" if refused else "federation.directory_unreachable",
                directory=self.directory,
                error=error,
                peers=len(self.peers),
            )
        self.directory_ok, self.directory_error = ok, error

    async def probe(self) -> None:
        """Measure the round trip to every fresh peer's gateway (``GET /healthz``)."""
        now = self.clock.monotonic()
        peers = [p for p in self.peers.all() if self.peers.fresh(p, now)]
        try:
            if peers:
                await asyncio.gather(*(self._probe(p.domain, p.summary.gateway_url) for p in peers))
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug must not end the probes: the next round tries again
            log(logging.ERROR, "federation.probe_error", exc_info=True)

    async def _get(self, url: str, headers: Mapping[str, str], timeout_s: float) -> Fetched:
        """GET ``url`` through the gateway's HTTP transport (its address guard, its size cap,
        no redirects: a peer's URL comes from another process), else this session's."""
        if self._fetch is not None:
            return await self._fetch(url, headers, timeout_s)
        assert self._session is not None
        try:
            async with asyncio.timeout(timeout_s):
                resp = await self._session.get(url, headers=headers, allow_redirects=False)
                async with resp:
                    data = await _read_capped(resp)
                    return Fetched(resp.status, data, dict(resp.headers), "")
        except TimeoutError:
            return Fetched(None, b"", {}, f"no answer within {timeout_s * 1000:.0f} ms")
        except (aiohttp.ClientError, ValueError) as exc:
            return Fetched(None, b"", {}, f"cannot be reached: {exc}")

    async def _probe(self, domain: str, gateway_url: str) -> None:
        timeout = PROBE_TIMEOUT_S
        started = self.clock.monotonic()
        # no credentials: /healthz needs none, and a peer token is nothing to hand out
        got = await self._get(f"{gateway_url}/healthz", {}, timeout)
        why = ""
        if got.status is None:
            why = f"its gateway did not answer a probe: {got.error}"
        elif not 200 <= got.status < 300:
            why = f"its /healthz answered HTTP {got.status}"
        rtt = None if why else (self.clock.monotonic() - started) * 1000.0
        if self.peers.probed(domain, rtt, why):
            peer = self.peers.get(domain)
            if why:
                log(logging.WARNING, "federation.peer_unreachable", domain=domain, reason=why)
            else:
                log(
                    logging.INFO,
                    "federation.peer_reachable",
                    domain=domain,
                    rtt_ms=None if peer is None or peer.rtt_ms is None else round(peer.rtt_ms, 3),
                )

    # --- reading ---------------------------------------------------------------------------

    async def fetch_trace(
        self,
        domain: str,
        trace_id: str,
        timeout_s: float,
        max_events: int,
        sender: str | None = None,
    ) -> list[dict[str, Any]] | str:
        """The events (at most ``max_events``, each with a numeric ``ts``) another domain's
        gateway holds for ``trace_id`` (of the requests of ``sender`` alone, as that gateway
        names it: ``agent://NAME@THIS_DOMAIN``, when given), or a string saying why there are
        none."""
        peer = self.peers.get(domain)
        if peer is None:
            return f"{domain} is not a known domain now"
        url = f"{peer.summary.gateway_url}/v1/traces/{quote(trace_id, safe='')}"
        if sender is not None:
            url += f"?sender={quote(sender, safe='')}"
        got = await self._get(url, self.headers(), timeout_s)
        if got.status is None:
            return f"{domain}: {got.error}"
        if got.status != 200:
            return f"{domain} answered HTTP {got.status}: {_detail(got.body)}"
        try:
            events = msgspec.json.decode(got.body).get("events")
        except (msgspec.DecodeError, AttributeError):
            return f"{domain}'s answer is not a trace"
        if not isinstance(events, list):
            return f"{domain}'s answer is not a trace"
        return [
            e
            for e in events[:max_events]
            if isinstance(e, dict) and isinstance(e.get("ts"), int | float)
        ]

    def describe(self) -> dict[str, Any]:
        """``GET /v1/federation``: this domain, its directory, its summary and its peers'."""
        now = self.clock.monotonic()
        peers = []
        for peer in self.peers.all():
            age = peer.age_s(now)
            peers.append(
                {
                    **msgspec.to_builtins(peer.summary),
                    "age_s": round(age, 3),
                    "stale": not self.peers.fresh(peer, now),
                    "rtt_ms": None if peer.rtt_ms is None else round(peer.rtt_ms, 3),
                    "reachable": not peer.unreachable,
                    "unreachable_reason": peer.unreachable or None,
                }
            )
        own = None
        if self.last_summary is not None:
            own = {
                **msgspec.to_builtins(self.last_summary),
                "age_s": None if self.published_at is None else round(now - self.published_at, 3),
                "bytes": self.summary_bytes,
                "intents_left_out": self.intents_left_out,
                "publish_ms": self.publish_ms,
            }
        return {
            "domain": self.domain,
            "directory": self.directory,
            "directory_ok": self.directory_ok,
            "directory_error": self.directory_error or None,
            "summary_interval_s": self.interval_s,
            "stale_after_s": self.peers.stale_after_s,
            "summary": own,
            "peers": peers,
        }


async def _entries(data: bytes) -> tuple[list[DirectoryEntry] | None, str]:
    """The summaries of a directory answer (None and why when it is not one), decoded one at a
    time with a yield to the event loop between two: an answer of many megabytes takes tens
    of milliseconds a megabyte to decode, and the gateway routes meanwhile."""
    if len(data) > MAX_DIRECTORY_ANSWER_BYTES:
        return None, f"its answer is over {MAX_DIRECTORY_ANSWER_BYTES} bytes"
    try:
        raw = _raw_answer.decode(data)
        entries = []
        for item in raw.summaries:
            entries.append(_entry_decoder.decode(item))
            await asyncio.sleep(0)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return None, f"its answer is not a directory answer: {exc}"
    return entries, ""


async def _read_capped(resp: aiohttp.ClientResponse) -> bytes:
    """The whole body, or its first MAX_DIRECTORY_ANSWER_BYTES + 1 bytes when it is longer
    (the caller refuses those). ``content.read(n)`` would give only what is buffered so far."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(1 << 16):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_DIRECTORY_ANSWER_BYTES:
            break
    return b"".join(chunks)


def _refused_summary(status: int, data: bytes) -> bool:
    """Whether a directory's error answer refuses this domain's summary (its size, its
    contents, the token, the directory's bound on domains), rather than saying the directory
    cannot serve at all (then reading the others' would fail too)."""
    if 400 <= status < 500:
        return True
    try:
        answer = msgspec.json.decode(data[:4096])
    except msgspec.DecodeError:
        return False
    return isinstance(answer, dict) and answer.get("error") == "registry_full"


def _detail(data: bytes) -> str:
    try:
        decoded = msgspec.json.decode(data[:4096])
    except msgspec.DecodeError:
        return data[:200].decode("utf-8", "replace")
    if isinstance(decoded, dict):
        return str(decoded.get("detail") or decoded.get("error") or "")[:200]
    return ""
