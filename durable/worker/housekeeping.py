"""Housekeeping: the periodic work that may be slow, on a thread of its own.

The ``worker_heartbeat`` signal's chores (its receivers may enqueue jobs) and
reclaiming the jobs of stopped workers (which may wait for a peer's row
lock). Kept off the renewal thread: neither may delay this process's renewals.

Through a database outage every worker's leases may expire (an outage longer
than the lease): not because their workers died, but because nobody could
renew. So for ``RECLAIM_GRACE_SECONDS`` after the database is back no reclaim
is made: a live worker renews its leases, or hands its jobs back, within a
second of the return (its loops look every second through an outage), and
only the jobs of workers that really died are left to take back.
"""

from __future__ import annotations

import logging
import random
import threading
import time

from django.db import connection

from .. import rescue, signals
from ..dbwatch import DatabaseWatch

log = logging.getLogger("durable.worker")

RECLAIM_GRACE_SECONDS = 5.0


def housekeeping_loop(
    worker_id: str,
    lease_seconds: float,
    stopping: threading.Event,
    finished: threading.Event,
    watch: DatabaseWatch | None = None,
) -> None:
    """Every third of a lease until ``finished``; a reclaim about every half lease."""
    watch = watch or DatabaseWatch(log, worker=worker_id)
    interval = max(lease_seconds / 3.0, 0.05)
    reclaim_every = max(lease_seconds / 2.0, 0.1)
    next_reclaim = time.monotonic() + reclaim_every * random.uniform(0.5, 1.0)
    delay, failures = interval, 0
    lost_at: float | None = None  # when this loop last found the database unreachable
    try:
        while not finished.wait(delay):
            try:
                # A receiver that lost the database is this loop's outage, said once.
                signals.send_now(
                    signals.worker_heartbeat, raise_unreachable=True, worker_id=worker_id
                )
                now = time.monotonic()
                if reclaim_due(
                    now,
                    next_reclaim,
                    stopping=stopping.is_set(),
                    lost_for=None if lost_at is None else now - lost_at,
                    database_back=not watch.down
                    and not watch.returned_within(RECLAIM_GRACE_SECONDS),
                ):
                    began = watch.now()
                    rescue.reclaim(worker_id)
                    # Only a reclaim surely asked the database (the receivers may not).
                    watch.succeeded(began)
                    next_reclaim = time.monotonic() + reclaim_every * random.uniform(0.8, 1.2)
            except Exception as exc:
                failures += 1
                unreachable = watch.failed(exc, "housekeeping round failed")
                if unreachable:
                    lost_at = time.monotonic()
                connection.close()
                delay = min(
                    interval,
                    watch.retry_delay(
                        failures, unreachable=unreachable, base=interval, cap=interval
                    ),
                )
                continue
            delay, failures = interval, 0
    finally:
        connection.close()


def reclaim_due(
    now: float, next_reclaim: float, *, stopping: bool, lost_for: float | None, database_back: bool
) -> bool:
    """Whether this round reclaims: its time has come, the worker is not stopping, and the
    database has been back for ``RECLAIM_GRACE_SECONDS`` — for the process's other loops
    (``database_back``) and for this one (``lost_for``: since it last found it unreachable;
    the others may not have heard of the return yet when this round is the first through)."""
    if stopping or now < next_reclaim or not database_back:
        return False
    return lost_for is None or lost_for >= RECLAIM_GRACE_SECONDS
