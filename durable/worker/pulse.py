"""SQLite's pulse: the file that tells peers on this machine this process is alive.

Its own thread, which never touches the database: lease renewals may wait for
SQLite's write lock for longer than a lease, the pulse never waits
(``durable.rescue.pulse``).
"""

from __future__ import annotations

import threading

from .. import rescue


def start_pulse(
    worker_id: str, lease_seconds: float, finished: threading.Event
) -> threading.Thread:
    """Touch the pulse now and every third of a lease until ``finished``."""
    interval = max(lease_seconds / 3.0, 0.05)

    def beat() -> None:
        rescue.pulse(worker_id)
        while not finished.wait(interval):
            rescue.pulse(worker_id)

    thread = threading.Thread(target=beat, name="durable-pulse", daemon=True)
    thread.start()
    return thread
