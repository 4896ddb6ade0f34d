"""Health: an endpoint's status, derived from its last heartbeat and its recent deliveries.

Invariants:
- Status is never stored: :func:`derive` computes it from ``(last_seen, stats, now, thresholds)``.
  Healthy while the heartbeat age is at most ``degraded_after``; degraded past it (or when the mean
  of the last 5 delivery latencies within the sample window is over ``slow_threshold_ms``);
  suspect past ``suspect_after`` or while passively ejected; down past ``down_after``.
- ``changes_at`` is the first time at which the status may change by time passing alone; any
  change by an event (heartbeat, delivery, ejection) is announced by the caller instead.
- All times are on the *liveness clock* (:class:`LivenessClock`): monotonic seconds minus the time
  the gateway itself was stalled, so a gateway that could not listen does not demote its agents.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import NamedTuple

from agent_reach.core.model import Status, Thresholds

__all__ = ["EndpointStats", "Health", "LivenessClock", "derive"]

SLOW_WINDOW = 5  # deliveries whose mean decides "slow" (contract)
P95_WINDOW = 100  # deliveries kept for p95 and avg
EWMA_DECAY_S = 10.0  # peak-EWMA time constant (Finagle/Linkerd use 10 s)
INF = math.inf


class Health(NamedTuple):  # a tuple: made on every status read, far cheaper than a dataclass
    """A derived status with the reason in words and when it may next change by itself."""

    status: Status
    reason: str
    changes_at: float
    slow_only: bool = False  # degraded only because it is slow: eligible for a probe share


class EndpointStats:
    """What one gateway saw of its own deliveries to one endpoint (mutable, no clock reads).

    Holds the recent latency samples, a peak-EWMA cost with in-flight count for load-aware
    choice, and the passive-check ejection mark.
    """

    __slots__ = ("_answered", "_ewma_at", "_samples", "_sum", "ejected_at", "ewma_ms", "inflight")

    def __init__(self) -> None:
        self._samples: deque[tuple[float, float, bool]] = deque(maxlen=P95_WINDOW)
        self._answered: list[float] = []  # answered samples' latencies, sorted (for p95)
        self._sum = 0.0  # of the answered samples (for avg)
        self.ewma_ms = 0.0  # optimistic prior: a new endpoint looks fast until it answers
        self._ewma_at = 0.0
        self.inflight = 0
        self.ejected_at: float | None = None

    def observe(
        self, latency_ms: float, now: float, *, answered: bool = True, penalty_ms: float = 0.0
    ) -> None:
        """Record one delivery that reached the agent: answered, or timed out on it.

        Every sample counts for "slow"; only answered ones count for p95, so that a hung agent's
        timeouts do not stretch the next per-try timeout (1.5 x p95) without end.
        ``penalty_ms`` is what a failure costs in the load-aware score, so that an endpoint that
        fails fast does not look fast.
        """
        samples = self._samples
        if len(samples) == samples.maxlen:
            _, old_ms, old_answered = samples[0]
            if old_answered:
                self._sum -= old_ms
                del self._answered[bisect.bisect_left(self._answered, old_ms)]
        samples.append((now, latency_ms, answered))
        if answered:
            self._sum += latency_ms
            bisect.insort(self._answered, latency_ms)
        self._observe_cost(max(latency_ms, penalty_ms), now)

    def penalize(self, penalty_ms: float, now: float) -> None:
        """Raise the load-aware cost without a latency sample (nothing reached the agent)."""
        self._observe_cost(penalty_ms, now)

    def _observe_cost(self, cost_ms: float, now: float) -> None:
        current = self.cost_ms(now)
        if cost_ms > current:
            self.ewma_ms = cost_ms
        else:
            w = math.exp(-max(0.0, now - self._ewma_at) / EWMA_DECAY_S)
            self.ewma_ms = current * w + cost_ms * (1 - w)
        self._ewma_at = now

    def cost_ms(self, now: float) -> float:
        """Peak-EWMA latency, decayed toward 0 while idle so that idle endpoints get tried again."""
        if self.ewma_ms == 0.0:
            return 0.0
        return self.ewma_ms * math.exp(-max(0.0, now - self._ewma_at) / EWMA_DECAY_S)

    def score(self, now: float) -> float:
        """Load-aware cost: lower is better (peak-EWMA latency x (in-flight + 1))."""
        return (self.cost_ms(now) + 1.0) * (self.inflight + 1)

    def recent_mean(self, now: float, ttl: float) -> tuple[float | None, float]:
        """Mean of the last 5 samples younger than ``ttl``, and when the oldest of them ages out."""
        total = 0.0
        n = 0
        oldest = INF
        for at, ms, _ in reversed(self._samples):
            if n == SLOW_WINDOW or now - at > ttl:
                break
            total += ms
            n += 1
            oldest = at
        if n == 0:
            return None, INF
        return total / n, oldest + ttl

    def latency_stats(self) -> tuple[float | None, float | None]:
        """(avg, p95) in ms of the answered deliveries kept (None, None before any answer).

        Timeouts count for "slow" but not here: a timeout is not a latency the agent showed.
        """
        answered = self._answered
        if not answered:
            return None, None
        return self._sum / len(answered), answered[math.ceil(0.95 * len(answered)) - 1]

    def p95_ms(self) -> float | None:
        """p95 latency of the answered deliveries kept (None with no history)."""
        return self.latency_stats()[1]


def derive(last_seen: float, stats: EndpointStats | None, now: float, t: Thresholds) -> Health:
    """The status of an endpoint at ``now`` (liveness clock)."""
    age = now - last_seen
    if age > t.down_after:
        return Health(Status.DOWN, f"no heartbeat for {age:.1f} s", INF)
    if age > t.suspect_after:
        return Health(Status.SUSPECT, f"no heartbeat for {age:.1f} s", last_seen + t.down_after)
    if stats is not None and stats.ejected_at is not None and stats.ejected_at >= last_seen:
        return Health(
            Status.SUSPECT,
            "connection refused or reset: out of intent routing until its next heartbeat",
            last_seen + t.down_after,
        )
    if age > t.degraded_after:
        return Health(
            Status.DEGRADED, f"heartbeat late ({age:.1f} s old)", last_seen + t.suspect_after
        )
    changes_at = last_seen + t.degraded_after
    if stats is not None:
        mean, ages_out = stats.recent_mean(now, t.sample_ttl)
        if mean is not None and mean > t.slow_threshold_ms:
            return Health(
                Status.DEGRADED,
                f"slow: mean {mean:.0f} ms over its last deliveries "
                f"(threshold {t.slow_threshold_ms:.0f} ms)",
                min(changes_at, ages_out),
                slow_only=True,
            )
        if mean is not None:
            changes_at = min(changes_at, ages_out)
    return Health(Status.HEALTHY, "healthy", changes_at)


ARRIVAL_STALL_S = 0.05  # a loop held longer than this delays what it reads after (arrival)
ARRIVAL_GRACE_S = 0.05  # reads this soon after a stall's end were waiting through it


class LivenessClock:
    """Monotonic time that does not advance while the gateway itself was stalled.

    A ticker calls :meth:`tick` every ``tick_interval`` seconds. A tick that comes more than
    ``tolerance`` late means the event loop was blocked (GC, overload, SIGSTOP); the lateness past
    the tolerance is credited, which extends every lease by the stall. Until the late tick runs,
    :meth:`now` is capped at the last tick plus interval plus tolerance, so that a request handled
    first thing after the stall does not see every agent as dead. The result never goes backwards.
    """

    __slots__ = ("_last_tick", "_latest", "credit", "last_stall", "tick_interval", "tolerance")

    def __init__(self, tick_interval: float, tolerance: float) -> None:
        self.tick_interval = tick_interval
        self.tolerance = tolerance
        self.credit = 0.0
        self._last_tick: float | None = None
        self._latest = -INF  # float rounding of the credit must not move time back
        # the last time the loop was held (from when its tick was due to when it ran), for
        # the arrival of requests read at its end (arrival())
        self.last_stall: tuple[float, float] | None = None

    def tick(self, mono: float) -> float:
        """Note a tick at monotonic ``mono``; return the loop lag seen (seconds, >= 0)."""
        lag = 0.0
        if self._last_tick is not None:
            due = self._last_tick + self.tick_interval
            lag = max(0.0, mono - due)
            if lag > self.tolerance:
                self.credit += lag - self.tolerance
            if lag > ARRIVAL_STALL_S:
                self.last_stall = (due, mono)
        self._last_tick = mono
        return lag

    def arrival(self, read_at: float) -> float:
        """When a request read at monotonic ``read_at`` may have arrived: the start of the
        stall it was read at the end of (its bytes waited in the socket while the loop was
        held, and its deadline has been running since), else ``read_at``. "At the end" is
        before the late tick ran or within ARRIVAL_GRACE_S after it (the loop may run its
        timers before the reads that waited). The estimate errs early: a request that came
        in just as the stall ended has its deadline shortened by the stall, never
        lengthened."""
        if self._last_tick is not None:
            due = self._last_tick + self.tick_interval
            if read_at - due > ARRIVAL_STALL_S:  # the tick is overdue: the loop is just back
                return due
        stall = self.last_stall
        if stall is not None and stall[0] <= read_at <= stall[1] + ARRIVAL_GRACE_S:
            return stall[0]
        return read_at

    def now(self, mono: float) -> float:
        """Liveness time at monotonic ``mono``."""
        if self._last_tick is not None:
            mono = min(mono, self._last_tick + self.tick_interval + self.tolerance)
        self._latest = max(self._latest, mono - self.credit)
        return self._latest
