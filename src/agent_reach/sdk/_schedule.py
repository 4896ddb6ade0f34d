"""When the heartbeat line calls the gateway next, and how long each call may take: pure.

No clock reads, no sleeps, no I/O: the line (:mod:`._beat`) passes the outcome of its last call,
how many failed in a row, and the interval, and waits what these functions say through its
injected clock. The jitter comes from the ``random.Random`` passed in (seeded in tests).

Invariants:

- Every wait is measured from the start of the previous call, not its end (:func:`sleep_for`):
  the next call starts that long after the previous one started, or as soon as it ended when it
  took longer. A slow answer does not push the next beat back.
- After a heartbeat or registration that worked, the wait is 0.6-0.8 x the interval: never
  late, and agents do not beat in step.
- A heartbeat waits for its answer until 0.9 x the interval after the previous call started at
  most (:func:`beat_timeout`; never less than 0.25 s, never more than :func:`call_bounds`
  allows), with one gateway too. So after a heartbeat that worked, the next call starts within
  ``max(0.9 x interval, 0.25 s)``: a heartbeat that times out is retried before the gateway's
  degraded-after (1 x the interval), where the whole ``request_timeout_s`` once let the gateway
  next hear from the agent 0.8 x interval + 5 s + backoff after the last beat (past its
  down-after, 3 x the interval, at an interval of 2 s).
- After "not registered" (404, or an endpoint token refused), no wait at all.
- After the n-th failure in a row (FAILED, UNREACHABLE, REFUSED or BROKEN), the wait is
  50-100 % of ``min(cap, 0.25 s x 2^(n-1))``, where ``cap`` is ``retry_max_s``, and once
  registered also the interval (a registered agent never goes longer than an interval between
  tries).
"""

from __future__ import annotations

import enum
import random

__all__ = [
    "BACKOFF_JITTER",
    "DEREGISTER_WITHIN_S",
    "FIRST_RETRY_S",
    "JITTER",
    "Outcome",
    "beat_timeout",
    "call_bounds",
    "next_wait",
    "sleep_for",
]

JITTER = (0.6, 0.8)  # a heartbeat period, as parts of the interval
BACKOFF_JITTER = (0.5, 1.0)
FIRST_RETRY_S = 0.25
DEREGISTER_WITHIN_S = 2.0
# with several gateways: the part of the interval a heartbeat may wait for its answer, and the
# least it is given (a busy gateway is not a dead one)
BEAT_WAIT = 0.15
BEAT_WAIT_MIN_S = 0.25
# a heartbeat's answer is awaited until this part of the interval after the previous call
# started: a timed-out one leaves time to try again before the gateway's degraded-after
BEAT_BY = 0.9
CONNECT_PART = 0.2
CONNECT_MIN_S = 0.1


class Outcome(enum.Enum):
    """How a registration or heartbeat ended, as the schedule sees it."""

    OK = "ok"
    UNKNOWN = "unknown"  # not registered (404, or a refused endpoint token): register now
    FAILED = "failed"  # no gateway reachable, or 5xx: back off and try again
    UNREACHABLE = "unreachable"  # this gateway connected but did not answer: try the others
    REFUSED = "refused"  # 4xx to a registration: our mistake, not the gateway's state
    # the call raised something unforeseen (a bug, or an answer no branch expects): a failure
    BROKEN = "broken"


def next_wait(
    outcome: Outcome,
    *,
    failures: int,
    interval: float,
    registered: bool,
    retry_max_s: float,
    rng: random.Random,
) -> float:
    """Seconds to wait after ``outcome``: a jittered heartbeat period after OK, nothing after
    UNKNOWN, else the jittered exponential backoff of the ``failures``-th failure in a row
    (0.25 s, 0.5 s, 1 s ... up to ``retry_max_s``; once registered, at most the interval)."""
    if outcome is Outcome.OK:
        return interval * rng.uniform(*JITTER)
    if outcome is Outcome.UNKNOWN:
        return 0.0
    cap = min(retry_max_s, interval) if registered else retry_max_s
    base = min(cap, FIRST_RETRY_S * 2.0 ** min(max(failures, 1) - 1, 16))
    return base * rng.uniform(*BACKOFF_JITTER)


def call_bounds(
    interval: float, *, several: bool, request_timeout_s: float, connect_timeout_s: float
) -> tuple[float, float]:
    """(how long a heartbeat waits in all, how long making a connection may take). With one
    gateway there is nowhere else to go: both get the whole ``request_timeout_s`` (a heartbeat
    is cut further by :func:`beat_timeout`)."""
    if not several:
        return request_timeout_s, request_timeout_s
    beat = min(request_timeout_s, max(BEAT_WAIT * interval, BEAT_WAIT_MIN_S))
    connect = min(connect_timeout_s, max(CONNECT_PART * interval, CONNECT_MIN_S))
    return beat, connect


def sleep_for(wait: float, *, started: float, now: float) -> float:
    """Seconds to sleep at ``now`` for the next call to start ``wait`` after the previous call
    started (at ``started``): none when that call took longer than ``wait``."""
    return max(0.0, started + wait - now)


def beat_timeout(bound: float, *, interval: float, since: float) -> float:
    """How long a heartbeat started ``since`` seconds after the previous call started may wait
    for its answer: what is left until ``BEAT_BY`` x ``interval`` after that call started, but
    at least ``BEAT_WAIT_MIN_S``, and never more than ``bound`` (:func:`call_bounds`'s)."""
    return min(bound, max(BEAT_BY * interval - since, BEAT_WAIT_MIN_S))
