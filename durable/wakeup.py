"""Wake-ups: an idle worker starts a newly due job at once instead of at its next poll.

PostgreSQL: a trigger on ``durable_job`` (migration 0012) sends ``NOTIFY
durable_job, '<queue>'`` in the transaction that makes a job due now — an
enqueue (single or bulk), a retry, a resume, a schedule's occurrence, a job
handed back at shutdown — so no code path can forget it and a rolled-back
enqueue wakes nobody. One connection per worker process ``LISTEN``s and wakes
one idle thread; a thread that claimed after a wake-up passes it on, so a
burst reaches every thread while a single job costs at most one empty claim.

SQLite has no notifications, but every worker shares one machine and one
file: ``PRAGMA data_version`` (which changes when another connection commits)
is read every ``DURABLE_SQLITE_WAKE_INTERVAL`` seconds while a thread is idle
— a read of shared memory, no lock, no I/O — and only when it changed does
one indexed read ask whether a job is due. Either way polling every
``--poll-interval`` stays: it is the timer for ``next_attempt_at`` in the
future (backoffs, jobs taken back after a restart) and the fallback while the
listening connection is down.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

from django.db import connections

log = logging.getLogger("durable.wakeup")

CHANNEL = "durable_job"


class Wakeup:
    """Where idle executor threads wait: for a wake-up token or the poll timeout.

    One token at most: it means "look again", and a thread that finds it after
    an empty claim claims again instead of sleeping, so a notification that
    arrives while a claim is on its way is never lost.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._token = False
        self._closed = False
        self.idle = 0  # threads waiting right now

    def signal(self) -> None:
        with self._cond:
            self._token = True
            self._cond.notify()

    def wait(self, timeout: float) -> bool:
        """Until a token (True: consumed) or ``timeout`` (False)."""
        with self._cond:
            if not self._token:
                self.idle += 1
                try:
                    self._cond.wait_for(lambda: self._token or self._closed, timeout)
                finally:
                    self.idle -= 1
            woken, self._token = self._token, False
            return woken

    def close(self) -> None:
        """Stopping: every waiting thread returns now, and no wait blocks any more."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def start_listener(
    wakeup: Wakeup,
    queues: list[str],
    finished: threading.Event,
    *,
    due_exists: Callable[[], bool],
    sqlite_interval: float,
) -> threading.Thread | None:
    """Start this process's wake-up thread for the default database's vendor."""
    vendor = connections["default"].vendor
    if vendor == "postgresql":
        target = _PgListener(wakeup, set(queues), finished).run
    elif vendor == "sqlite":
        target = _SqliteWatcher(wakeup, finished, due_exists, sqlite_interval).run
    else:
        return None
    thread = threading.Thread(target=target, name="durable-wakeup", daemon=True)
    thread.start()
    return thread


class _PgListener:
    def __init__(self, wakeup: Wakeup, queues: set[str], finished: threading.Event) -> None:
        self.wakeup, self.queues, self.finished = wakeup, queues, finished

    def run(self) -> None:
        delay = 0.5
        while not self.finished.is_set():
            conn = connections.create_connection("default")  # not a worker thread's own
            try:
                conn.ensure_connection()
                raw = conn.connection
                raw.execute(f"LISTEN {CHANNEL}")
                delay = 0.5
                # Whatever was enqueued while nobody listened is looked for once.
                self.wakeup.signal()
                while not self.finished.is_set():
                    for notice in raw.notifies(timeout=0.5):
                        if notice.payload in self.queues:
                            self.wakeup.signal()
            except Exception as exc:
                log.warning(
                    "wake-up listener lost its connection; polling meanwhile",
                    extra={"error": str(exc)[:200], "retry_in": delay},
                )
                self.finished.wait(delay)
                delay = min(delay * 2, 30.0)
            finally:
                with contextlib.suppress(Exception):  # a broken connection may fail to close
                    conn.close()


class _SqliteWatcher:
    def __init__(
        self,
        wakeup: Wakeup,
        finished: threading.Event,
        due_exists: Callable[[], bool],
        interval: float,
    ) -> None:
        self.wakeup, self.finished = wakeup, finished
        self.due_exists, self.interval = due_exists, interval

    def run(self) -> None:
        conn = connections["default"]  # this thread's own connection
        last = None
        try:
            while not self.finished.wait(self.interval):
                if not self.wakeup.idle:
                    last = None  # busy threads claim by themselves; look afresh when idle
                    continue
                try:
                    with conn.cursor() as cursor:
                        cursor.execute("PRAGMA data_version")
                        version = cursor.fetchone()[0]
                    if version == last:
                        continue
                    last = version
                    if self.due_exists():
                        self.wakeup.signal()
                except Exception:
                    log.exception("wake-up check failed")
                    conn.close()
                    self.finished.wait(1.0)
        finally:
            conn.close()
