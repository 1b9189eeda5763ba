"""Wake-ups: an idle worker starts a newly due job at once instead of at its next poll.

PostgreSQL: a trigger on ``durable_job`` (migration 0012) sends ``NOTIFY
durable_job, '<queue>'`` in the transaction that makes a job due now — an
enqueue (single or bulk), a retry, a resume, a schedule's occurrence, a job
handed back at shutdown — so no code path can forget it and a rolled-back
enqueue wakes nobody. One connection per worker process ``LISTEN``s and wakes
one idle thread; a thread that claimed after a wake-up passes it on, so a
burst reaches every thread while a single job costs at most one empty claim.
That connection is the ``default`` database's, or the one ``DURABLE_LISTEN_URL``
names (one that bypasses a pooler in transaction mode, which cannot keep a
LISTEN); either way the listener first checks that a notification sent through
``default`` reaches it, and polls instead when none does.

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
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from django.conf import settings
from django.db import connections

from .dbwatch import DatabaseWatch

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
    watch: DatabaseWatch | None = None,
) -> threading.Thread | None:
    """Start this process's wake-up thread for the default database's vendor.

    ``watch``: the process's watch on its database, told when the ``default``
    database is lost or back (the listening connection's, unless it is one of
    ``DURABLE_LISTEN_URL``: that one's outages are told apart, by a watch of its own).
    """
    vendor = connections["default"].vendor
    if vendor == "postgresql":
        url = getattr(settings, "DURABLE_LISTEN_URL", "") or ""
        target = _PgListener(wakeup, set(queues), finished, listen_url=url, watch=watch).run
    elif vendor == "sqlite":
        target = _SqliteWatcher(wakeup, finished, due_exists, sqlite_interval).run
    else:
        return None
    thread = threading.Thread(target=target, name="durable-wakeup", daemon=True)
    thread.start()
    return thread


class _DefaultFailed(Exception):
    """The check's notification could not be sent through the ``default`` database."""


class _PgListener:
    """LISTENs on one connection of its own, which must keep its session between statements.

    Behind a pooler in transaction mode (PgBouncer's ``pool_mode = transaction``)
    it does not: the LISTEN lands on whichever server connection ran it, and the
    notifications go to whichever client that connection serves next, or
    nowhere. So before listening for jobs the listener checks that a
    notification sent the way an enqueue sends it (through the ``default``
    database) reaches it, on a channel of its own that nobody else uses: if
    none arrives, it says so once and the worker polls (``--poll-interval``),
    looking again every ``RECHECK_SECONDS``. ``DURABLE_LISTEN_URL`` names a
    connection that bypasses the pooler, for wake-ups within milliseconds.
    """

    PROBE_SECONDS = 5.0  # how long a notification may take to arrive before we give up
    RECHECK_SECONDS = 300.0  # how often a listener whose check failed tries again
    POLL = 0.5  # how long one wait for notifications lasts (then finished is looked at)

    def __init__(
        self,
        wakeup: Wakeup,
        queues: set[str],
        finished: threading.Event,
        *,
        listen_url: str = "",
        watch: DatabaseWatch | None = None,
    ) -> None:
        self.wakeup, self.queues, self.finished = wakeup, queues, finished
        self.listen_url = listen_url
        # The default database's outages are the worker's, said once for all its loops;
        # those of a connection of its own (DURABLE_LISTEN_URL) are told apart: the
        # two may come and go separately, and one watch would then flap.
        self.default_watch = watch or DatabaseWatch(log)
        self.watch = (
            DatabaseWatch(log, listening="DURABLE_LISTEN_URL") if listen_url else self.default_watch
        )
        self.probe_channel = f"durable_probe_{secrets.token_hex(8)}"
        self.pooled_warned = False

    def run(self) -> None:
        failures = 0
        while not self.finished.is_set():
            raw: Any = None
            began = self.watch.now()
            try:
                raw = self._connect()
                if not self._notifications_arrive(raw):
                    if self.finished.is_set():
                        break  # stopping during the check: it proved nothing
                    failures = 0
                    self._say_pooled()
                    self.finished.wait(self.RECHECK_SECONDS)
                    continue
                raw.execute(f"LISTEN {CHANNEL}")
                self.watch.succeeded(began)
                failures = 0
                # Whatever was enqueued while nobody listened is looked for once.
                self.wakeup.signal()
                self._listen(raw)
            except Exception as exc:
                failures += 1
                watch = self.default_watch if isinstance(exc, _DefaultFailed) else self.watch
                unreachable = watch.failed(
                    exc, "wake-up listener failed; polling meanwhile", failures=failures
                )
                self.finished.wait(
                    self.watch.retry_delay(failures, unreachable=unreachable, base=0.5, cap=30.0)
                )
            finally:
                if raw is not None:
                    with contextlib.suppress(Exception):  # a broken connection may fail to close
                        raw.close()

    def _connect(self) -> Any:
        """The raw psycopg connection to listen on, in autocommit."""
        if self.listen_url:
            return psycopg.connect(self.listen_url, autocommit=True, connect_timeout=10)
        conn = connections.create_connection("default")  # not a worker thread's own
        conn.ensure_connection()
        raw = conn.connection
        raw.autocommit = True
        return raw

    def _notifications_arrive(self, raw: Any) -> bool:
        """Send a notification through the ``default`` database; does it reach ``raw``?"""
        token = secrets.token_hex(8)
        raw.execute(f"LISTEN {self.probe_channel}")
        try:
            conn = connections["default"]  # this thread's own: the way an enqueue notifies
            try:
                with conn.cursor() as cursor:
                    cursor.execute("SELECT pg_notify(%s, %s)", [self.probe_channel, token])
            except Exception as exc:
                raise _DefaultFailed(str(exc)) from exc
            finally:
                conn.close()
            deadline = time.monotonic() + self.PROBE_SECONDS
            while (left := deadline - time.monotonic()) > 0 and not self.finished.is_set():
                for notice in raw.notifies(timeout=min(left, self.POLL)):
                    if notice.channel == self.probe_channel and notice.payload == token:
                        return True
            return False
        finally:
            # Behind a pooler this may land on another server connection than the
            # LISTEN did; the channel is this process's own, so a registration left
            # behind is never notified again.
            raw.execute(f"UNLISTEN {self.probe_channel}")

    def _say_pooled(self) -> None:
        if self.pooled_warned:
            return
        self.pooled_warned = True
        log.warning(
            "wake-ups do not arrive on this connection (a pooler in transaction mode?); "
            "idle workers poll instead: set DURABLE_LISTEN_URL to a connection that bypasses it",
            extra={"listening": "DURABLE_LISTEN_URL" if self.listen_url else "default"},
        )

    def _listen(self, raw: Any) -> None:
        while not self.finished.is_set():
            for notice in raw.notifies(timeout=self.POLL):
                if notice.channel == CHANNEL and notice.payload in self.queues:
                    self.wakeup.signal()


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
