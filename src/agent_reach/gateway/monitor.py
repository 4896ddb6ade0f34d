"""Background loops of a gateway: the stall guard's ticker and the purge of old down records.

Each loop catches and logs per iteration, backs off, and lets cancellation through.
"""

from __future__ import annotations

import asyncio
import logging

from agent_reach.gateway.metrics import GatewayMetrics
from agent_reach.gateway.router import STALL_TICK_S, Router
from agent_reach.observability.logs import log

__all__ = ["run_purger", "run_ticker"]


async def run_ticker(gateway: Router, metrics: GatewayMetrics) -> None:
    """Tick the liveness clock; a late tick is a gateway stall credited to every lease."""
    clock = gateway.clock
    liveness = gateway.liveness
    liveness.tick(clock.monotonic())  # the baseline: a stall right after start counts too
    while True:
        await clock.sleep(STALL_TICK_S)
        try:
            lag = liveness.tick(clock.monotonic())
            metrics.loop_lag.set(lag)
        except asyncio.CancelledError:
            raise
        except Exception:  # the ticker must outlive any fault: liveness time depends on it
            log(logging.ERROR, "gateway.ticker_failed", exc_info=True)
            continue
        if lag > liveness.tolerance:
            metrics.stall_credit.set(liveness.credit)
            log(
                logging.WARNING,
                "gateway.stalled",
                lag_s=round(lag, 3),
                credited_s=round(lag - liveness.tolerance, 3),
                note="leases extended: endpoints are not demoted for the gateway's own stall",
            )


async def run_purger(gateway: Router) -> None:
    """Delete records whose last heartbeat is older than the purge time."""
    period = min(60.0, gateway.settings.purge_after_s / 4)
    while True:
        await gateway.clock.sleep(period)
        try:
            await gateway.purge()
        except asyncio.CancelledError:
            raise
        except Exception:
            log(logging.ERROR, "registry.purge_failed", exc_info=True)
            await gateway.clock.sleep(period)
