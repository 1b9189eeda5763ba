"""Housekeeping: the periodic work that may be slow, on a thread of its own.

The ``worker_heartbeat`` signal's chores (its receivers may enqueue jobs) and
reclaiming the jobs of stopped workers (which may wait for a peer's row
lock). Kept off the renewal thread: neither may delay this process's renewals.
"""

from __future__ import annotations

import logging
import random
import threading
import time

from django.db import connection

from .. import rescue, signals

log = logging.getLogger("durable.worker")


def housekeeping_loop(
    worker_id: str, lease_seconds: float, stopping: threading.Event, finished: threading.Event
) -> None:
    """Every third of a lease until ``finished``; a reclaim about every half lease."""
    interval = max(lease_seconds / 3.0, 0.05)
    reclaim_every = max(lease_seconds / 2.0, 0.1)
    next_reclaim = time.monotonic() + reclaim_every * random.uniform(0.5, 1.0)
    try:
        while not finished.wait(interval):
            try:
                signals.send_now(signals.worker_heartbeat, worker_id=worker_id)
                if time.monotonic() >= next_reclaim and not stopping.is_set():
                    rescue.reclaim(worker_id)
                    next_reclaim = time.monotonic() + reclaim_every * random.uniform(0.8, 1.2)
            except Exception:
                log.exception("housekeeping round failed", extra={"worker": worker_id})
                connection.close()
    finally:
        connection.close()
