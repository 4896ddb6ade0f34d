"""Health: an endpoint's status, derived from its last heartbeat and its recent deliveries.

Invariants:
- Status is never stored: :func:`derive` computes it from ``(last_seen, stats, now, thresholds)``.
  Healthy while the heartbeat age is at most ``degraded_after``; degraded past it (or while slow);
  suspect past ``suspect_after`` or while passively ejected; down past ``down_after``.
- Slow, with hysteresis: an endpoint becomes slow when the mean of its last 5 delivery latencies
  within the sample window is over ``slow_threshold_ms``, and stops being slow only when that
  mean is under ``SLOW_RECOVERY x slow_threshold_ms`` (or no sample is left in the window), so
  that an endpoint near the threshold does not flap. The only state kept is whether it was slow
  after its last sample (:attr:`EndpointStats.slow`); from there the hysteresis moves on each
  smaller window as the samples age out (:meth:`EndpointStats.slowness`), so that time alone
  never turns a recovered endpoint slow again.
- Recovery: a failed attempt (timeout, 5xx, connection error) penalizes the endpoint; a refused
  or reset connection also ejects it. A penalized or ejected endpoint is *recovering*: it becomes
  probe-eligible (``Health.probe``) at ``probe_at``, a backoff after its last failure that grows
  with its strikes (failures less than ``STRIKE_MEMORY_S`` apart) from ``PROBE_BACKOFF_S`` to at
  most ``PROBE_BACKOFF_MAX_S``. An answer ends the penalty and the ejection (and forgets the
  failure's cost); a heartbeat ends an ejection.
- Load-aware cost: peak-EWMA of latency (a failure counts as ``penalty_ms``), decayed toward 0
  while idle. Its time constant grows with the samples behind it, ``EWMA_DECAY_S x n /
  WARMUP_SAMPLES`` up to ``EWMA_DECAY_S`` (a warm-up), so that a cost taken from one slow first
  answer (a cold process) does not keep a new or restarted endpoint out for seconds; the cost of
  a penalized endpoint always decays at the full ``EWMA_DECAY_S``. A new endpoint, a forgiven
  one and a registration again (unless penalized) start the cost again at 0 (optimistic); an
  answer that ends a penalty starts it at that answer.
- ``changes_at`` is the first time at which the status (or the probe flag) may change by time
  passing alone; any change by an event (heartbeat, delivery, ejection) is announced by the
  caller instead.
- All times are on the *liveness clock* (:class:`LivenessClock`): monotonic seconds minus the time
  the gateway itself was stalled, so a gateway that could not listen does not demote its agents.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from typing import NamedTuple

from agent_reach.core.model import Status, Thresholds

__all__ = [
    "PROBE_BACKOFF_MAX_S",
    "PROBE_BACKOFF_S",
    "SLOW_RECOVERY",
    "STRIKE_MEMORY_S",
    "WARMUP_SAMPLES",
    "EndpointStats",
    "Health",
    "LivenessClock",
    "derive",
    "probe_backoff_s",
    "slow_after",
]

SLOW_WINDOW = 5  # deliveries whose mean decides "slow" (contract)
SLOW_RECOVERY = 0.8  # slow until the mean is under this share of the threshold (hysteresis)
PROBE_BACKOFF_S = 0.5  # a recovering endpoint's first probe comes this long after its failure
PROBE_BACKOFF_MAX_S = 5.0  # the backoff doubles with each strike, up to this
STRIKE_MEMORY_S = 30.0  # a failure this long after the previous one starts a new count
P95_WINDOW = 100  # deliveries kept for p95 and avg
EWMA_DECAY_S = 10.0  # peak-EWMA time constant (Finagle/Linkerd use 10 s)
WARMUP_SAMPLES = 20  # cost samples after which it decays at the full EWMA_DECAY_S
INF = math.inf


class Health(NamedTuple):  # a tuple: made on every status read, far cheaper than a dataclass
    """A derived status with the reason in words and when it may next change by itself."""

    status: Status
    reason: str
    changes_at: float
    slow_only: bool = False  # degraded only because it is slow: a probe cures that
    probe: bool = False  # eligible for the probe share (slow only, or recovering and due)


def slow_after(was_slow: bool, mean_ms: float | None, threshold_ms: float) -> bool:
    """Whether an endpoint is slow, given whether it was and its recent mean (hysteresis).

    Slow over ``threshold_ms``; not slow under ``SLOW_RECOVERY x threshold_ms`` or with no
    recent sample; in between, as it was.
    """
    if mean_ms is None:
        return False
    if mean_ms > threshold_ms:
        return True
    if mean_ms < SLOW_RECOVERY * threshold_ms:
        return False
    return was_slow


def probe_backoff_s(strikes: int) -> float:
    """How long after its last failure a recovering endpoint with ``strikes`` is probed."""
    # the exponent capped: strikes grow without bound in a long outage (2.0 ** 1024 overflows)
    return min(PROBE_BACKOFF_S * 2.0 ** min(max(0, strikes - 1), 32), PROBE_BACKOFF_MAX_S)


class EndpointStats:
    """What one gateway saw of its own deliveries to one endpoint (mutable, no clock reads).

    Holds the recent latency samples, a peak-EWMA cost with in-flight count for load-aware
    choice, whether it was slow after its last sample (hysteresis), and the recovery state: the
    passive-check ejection mark, the penalty of a failed attempt, the strikes and ``probe_at``.
    """

    __slots__ = (
        "_answered",
        "_cost_n",
        "_decay_s",
        "_ewma_at",
        "_failed_at",
        "_samples",
        "_sum",
        "ejected_at",
        "ewma_ms",
        "inflight",
        "penalized",
        "probe_at",
        "slow",
        "strikes",
    )

    def __init__(self) -> None:
        self._samples: deque[tuple[float, float, bool]] = deque(maxlen=P95_WINDOW)
        self._answered: list[float] = []  # answered samples' latencies, sorted (for p95)
        self._sum = 0.0  # of the answered samples (for avg)
        self.ewma_ms = 0.0  # optimistic prior: a new endpoint looks fast until it answers
        self._ewma_at = 0.0
        self._cost_n = 0  # samples behind the cost since it last started again
        self._decay_s = _warmup_decay_s(0)  # its time constant (EWMA_DECAY_S once warm)
        self.inflight = 0
        self.ejected_at: float | None = None
        self.slow = False  # slow after the last sample (the hysteresis' memory)
        self.penalized = False  # its last attempt failed and it has not answered since
        self.strikes = 0  # failures in a row, each less than STRIKE_MEMORY_S after the last
        self._failed_at = -INF
        self.probe_at = INF  # when a recovering endpoint may be probed (INF: not recovering)

    @property
    def recovering(self) -> bool:
        """Ejected or penalized: out of routing, or losing every choice, until it answers."""
        return self.ejected_at is not None or self.penalized

    def observe(
        self,
        latency_ms: float,
        now: float,
        *,
        answered: bool = True,
        penalty_ms: float = 0.0,
        t: Thresholds | None = None,
    ) -> None:
        """Record one delivery that reached the agent: answered, or timed out on it.

        Every sample counts for "slow"; only answered ones count for p95, so that a hung agent's
        timeouts do not stretch the next per-try timeout (1.5 x p95) without end.
        ``penalty_ms`` is what a failure costs in the load-aware score, so that an endpoint that
        fails fast does not look fast. With ``t``, the slow flag's hysteresis moves on this
        sample (without, the flag keeps its value: tests that look at one mean).
        """
        was_slow = self.is_slow(now, t) if t is not None else False
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
        # (conditional expressions, not max()/min(): ~700 instructions a call, and this
        # module's methods run several times a request; benchmarks/RESULTS.md)
        self._observe_cost(latency_ms if latency_ms > penalty_ms else penalty_ms, now)
        if t is not None:
            mean = self.recent_mean(now, t.sample_ttl)[0]
            self.slow = slow_after(was_slow, mean, t.slow_threshold_ms)

    def is_slow(self, now: float, t: Thresholds) -> bool:
        """Whether the endpoint is slow at ``now``: the hysteresis over its recent mean."""
        return self.slowness(now, t)[0]

    def slowness(self, now: float, t: Thresholds) -> tuple[bool, float | None, float]:
        """Whether the endpoint is slow at ``now``, the mean of its recent samples (None: none
        left) and when the oldest of them ages out.

        The hysteresis moves on every window the endpoint had since its last sample, not only
        on the one of ``now``: as its older samples age out the window shrinks, one sample at a
        time, and its mean moves without a new delivery. A mean that went under the recovery
        line on the way is a recovery, even if a later, smaller window is back in the band
        (5000, 1000, 1000, 1900, 1900 ms at a 2000 ms threshold: slow, then 1450 ms, healthy,
        then 1600 ms: still healthy, not slow again).
        """
        samples = self._samples
        if not samples:
            return False, None, INF
        ttl = t.sample_ttl
        total = 0.0
        n = 0
        oldest = INF
        for at, ms, _ in reversed(samples):  # the usual case first: none aged out since the last
            if n == SLOW_WINDOW:
                break
            if now > at + ttl:
                if samples[-1][0] - at <= ttl:  # one has: the windows between (below)
                    return self._slowness_aged(now, t)
                break
            total += ms
            n += 1
            oldest = at
        if n == 0:
            return False, None, INF
        mean = total / n
        return slow_after(self.slow, mean, t.slow_threshold_ms), mean, oldest + ttl

    def _slowness_aged(self, now: float, t: Thresholds) -> tuple[bool, float | None, float]:
        """:meth:`slowness` when samples of the last sample's window aged out since."""
        samples = self._samples
        ttl = t.sample_ttl
        last_at = samples[-1][0]
        sums: list[float] = []  # sums[k - 1]: of the newest k samples of the last sample's window
        times: list[float] = []  # times[k - 1]: when the k-th newest was taken
        total = 0.0
        n = 0  # of them still in the window at now
        oldest = INF
        for at, ms, _ in reversed(samples):
            if len(sums) == SLOW_WINDOW or last_at - at > ttl:
                break
            total += ms
            sums.append(total)
            times.append(at)
            if now <= at + ttl:
                n, oldest = len(sums), at
        slow = self.slow  # after the last sample, over its window (all of sums)
        threshold = t.slow_threshold_ms
        # that window again (a no-op when the flag was set from it), then each smaller one
        # there was since, as its samples aged out (samples taken at one instant age out
        # together: no window between)
        for k in range(len(sums), n - 1, -1):
            if k == 0:
                slow = False
            elif k == len(sums) or times[k - 1] != times[k]:
                slow = slow_after(slow, sums[k - 1] / k, threshold)
        if n == 0:
            return False, None, INF
        return slow, sums[n - 1] / n, oldest + ttl

    def fail(self, now: float) -> None:
        """A failed attempt (timeout, 5xx, connection error): penalized, one more strike, and
        probe-eligible again after the strikes' backoff. The cost decays at the full time
        constant until an answer ends the penalty (a failing endpoint gets no warm-up)."""
        self._fold(now)
        if now - self._failed_at > STRIKE_MEMORY_S:
            self.strikes = 0
        self.strikes += 1
        self._failed_at = now
        self.penalized = True
        self.probe_at = now + probe_backoff_s(self.strikes)

    def eject(self, now: float) -> None:
        """A refused or reset connection: out of intent routing at once (and a failure)."""
        self.ejected_at = now
        self.fail(now)

    def recover(self, latency_ms: float, now: float) -> None:
        """It answered: the ejection and the penalty end, and the failures' cost is forgotten
        (its cost is this answer's latency), so that it gets its share back at once."""
        self.ejected_at = None
        self.penalized = False
        self.probe_at = INF
        self._restart_cost(latency_ms, now, 1)

    def forgive(self) -> None:
        """A heartbeat ended its ejection: the failures' cost goes too (it starts again as a
        new endpoint does, looking fast until it answers)."""
        self.ejected_at = None
        self.penalized = False
        self.probe_at = INF
        self._restart_cost(0.0, self._ewma_at, 0)

    def renew(self) -> None:
        """The endpoint registered again (perhaps a new process): its cost starts again as a
        new endpoint's does, unless it is penalized (a failing agent that registers again keeps
        its penalty until it answers). Its samples (p95, slow) stay."""
        if not self.penalized:
            self._restart_cost(0.0, self._ewma_at, 0)

    def penalize(self, penalty_ms: float, now: float) -> None:
        """Raise the load-aware cost without a latency sample (nothing reached the agent)."""
        self._observe_cost(penalty_ms, now)

    def at_least(self, latency_ms: float, now: float) -> None:
        """Learn, without a sample, that a delivery had not answered after ``latency_ms``: a
        lower bound of its latency, which raises the load-aware cost to it and never lowers
        it (an attempt cut short at 95 ms says nothing against a cost of 200 ms)."""
        if latency_ms > self.cost_ms(now):
            self._observe_cost(latency_ms, now)

    def _restart_cost(self, cost_ms: float, now: float, n: int) -> None:
        self.ewma_ms = cost_ms
        self._ewma_at = now
        self._cost_n = n
        self._decay_s = _warmup_decay_s(n)

    def _fold(self, now: float) -> None:
        """Take the decay up to ``now`` into the cost, so that a change of the time constant
        does not change the past."""
        if now > self._ewma_at:
            self.ewma_ms = self.cost_ms(now)
            self._ewma_at = now

    def _observe_cost(self, cost_ms: float, now: float) -> None:
        current = self.cost_ms(now)
        if cost_ms > current:
            self.ewma_ms = cost_ms
        else:
            tau = EWMA_DECAY_S if self.penalized else self._decay_s
            idle = now - self._ewma_at
            w = math.exp(-(idle if idle > 0.0 else 0.0) / tau)
            self.ewma_ms = current * w + cost_ms * (1 - w)
        self._ewma_at = now
        if self._cost_n < WARMUP_SAMPLES:  # one more sample: it decays more slowly from now
            self._cost_n += 1
            self._decay_s = _warmup_decay_s(self._cost_n)

    def cost_ms(self, now: float) -> float:
        """Peak-EWMA latency, decayed toward 0 while idle so that idle endpoints get tried again
        (faster while few samples are behind it: the module docstring's warm-up)."""
        if self.ewma_ms == 0.0:
            return 0.0
        tau = EWMA_DECAY_S if self.penalized else self._decay_s
        idle = now - self._ewma_at
        return self.ewma_ms * math.exp(-(idle if idle > 0.0 else 0.0) / tau)

    def score(self, now: float) -> float:
        """Load-aware cost: lower is better (peak-EWMA latency x (in-flight + 1))."""
        return (self.cost_ms(now) + 1.0) * (self.inflight + 1)

    def recent_mean(self, now: float, ttl: float) -> tuple[float | None, float]:
        """Mean of the last 5 samples younger than ``ttl``, and when the oldest of them ages out."""
        total = 0.0
        n = 0
        oldest = INF
        for at, ms, _ in reversed(self._samples):
            if n == SLOW_WINDOW or now > at + ttl:
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


def _warmup_decay_s(n: int) -> float:
    """The cost's time constant with ``n`` samples behind it (at least one's worth)."""
    return EWMA_DECAY_S * min(max(n, 1), WARMUP_SAMPLES) / WARMUP_SAMPLES


def derive(last_seen: float, stats: EndpointStats | None, now: float, t: Thresholds) -> Health:
    """The status of an endpoint at ``now`` (liveness clock)."""
    # each threshold compared as the due time it gives (last_seen + x), not as an age: the two
    # can differ by a rounding, and a status must change exactly when its changes_at says
    age = now - last_seen
    if now > last_seen + t.down_after:
        return Health(Status.DOWN, f"no heartbeat for {age:.1f} s", INF)
    if now > last_seen + t.suspect_after:
        return Health(Status.SUSPECT, f"no heartbeat for {age:.1f} s", last_seen + t.down_after)
    if stats is not None and stats.ejected_at is not None and stats.ejected_at >= last_seen:
        until = last_seen + t.down_after
        reason = (
            "connection refused or reset: out of intent routing until its next heartbeat"
            " or a successful probe"
        )
        if now > stats.probe_at:  # probed until its heartbeat is late enough to be suspect
            probed = reason + " (probed now)"
            return Health(Status.SUSPECT, probed, last_seen + t.suspect_after, probe=True)
        return Health(Status.SUSPECT, reason, min(until, stats.probe_at))
    if now > last_seen + t.degraded_after:
        return Health(
            Status.DEGRADED, f"heartbeat late ({age:.1f} s old)", last_seen + t.suspect_after
        )
    changes_at = last_seen + t.degraded_after
    if stats is None:
        return Health(Status.HEALTHY, "healthy", changes_at)
    probe = False
    if stats.penalized:  # a failed attempt: probed after its backoff, so that it shows it is back
        if now > stats.probe_at:
            probe = True
        else:
            changes_at = min(changes_at, stats.probe_at)
    slow, mean, ages_out = stats.slowness(now, t)
    if mean is not None:
        changes_at = min(changes_at, ages_out)
        if slow:
            return Health(
                Status.DEGRADED,
                f"slow: mean {mean:.0f} ms over its last deliveries (threshold"
                f" {t.slow_threshold_ms:.0f} ms; healthy again under"
                f" {SLOW_RECOVERY * t.slow_threshold_ms:.0f} ms)",
                changes_at,
                slow_only=True,
                probe=True,
            )
    return Health(Status.HEALTHY, "healthy", changes_at, probe=probe)


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
            cap = self._last_tick + self.tick_interval + self.tolerance
            if mono > cap:
                mono = cap
        latest = mono - self.credit
        if latest > self._latest:
            self._latest = latest
        return self._latest
