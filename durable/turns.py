"""SQLite: writers take turns for the database's one write lock.

SQLite's busy handler is not a queue. A process waiting for the write lock
sleeps and retries (after 1, 2, 5, 10 … ms, then every 100 ms), while a worker
running atomic units back to back takes the lock again microseconds after each
commit: the waiter almost never finds it free. Its renewal, claim, commit or
start-up then waits for the whole run of atomic units — up to the busy timeout,
and then fails with "database is locked".

So writers announce themselves. While a process waits for the write lock it
holds a shared ``flock`` on ``<database file>-turns`` (one open file per thread,
so a process's threads count separately); a worker about to take the lock for
its next atomic unit first gives way while anyone is announced, for at most
``MAX_GIVE_WAY`` so that a steady stream of writers cannot stall it either. The
kernel drops a dead process's flock, so a crashed waiter never holds anyone up.

Every statement that takes the write lock through Django announces itself (an
execute wrapper on each SQLite connection: ``BEGIN`` and autocommit writes), in
workers, web servers and commands alike; the engine's hot commit path, which
bypasses Django's cursor, announces its ``BEGIN IMMEDIATE`` itself. PostgreSQL
and in-memory SQLite databases need none of this and get none.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection as default_connection
from django.db.backends.base.base import BaseDatabaseWrapper

# A worker gives way at most this long before its next atomic unit: longer than
# SQLite's slowest busy-handler retry (100 ms), so each announced waiter gets at
# least one try at the free lock, and short enough to bound what others cost it.
MAX_GIVE_WAY = 0.5
_POLL = 0.002  # seconds between looks while giving way
_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")

_local = threading.local()  # .files: this thread's open lock files, by path

# What Django's execute wrappers are handed: the next wrapper (or the cursor's own
# execute) with the statement, its parameters, many, and the context (connection, cursor).
Execute = Callable[[str, Any, bool, dict[str, Any]], Any]


def sqlite_file(conn: BaseDatabaseWrapper) -> str | None:
    """``conn``'s SQLite database file; None for PostgreSQL or an in-memory database."""
    if conn.vendor != "sqlite":
        return None
    name = str(conn.settings_dict.get("NAME") or "")
    if not name or name == ":memory:" or name.startswith("file:") or "mode=memory" in name:
        return None
    return name


def turns_path(conn: BaseDatabaseWrapper) -> str | None:
    """The lock file beside ``conn``'s SQLite database; None where turns do not apply."""
    name = sqlite_file(conn)
    return None if name is None else f"{name}-turns"


class _LockFile:
    """One thread's open lock file: its own open file description, so that its
    flock counts apart from the other threads'. Closed with the thread."""

    def __init__(self, path: str) -> None:
        self.pid = os.getpid()  # a forked child opens its own
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def __del__(self) -> None:
        os.close(self.fd)


def _descriptor(conn: BaseDatabaseWrapper) -> int | None:
    path = turns_path(conn)
    if path is None:
        return None
    opened: dict[str, _LockFile] | None = getattr(_local, "files", None)
    if opened is None:
        opened = _local.files = {}
    lock_file = opened.get(path)
    if lock_file is None or lock_file.pid != os.getpid():
        try:
            lock_file = opened[path] = _LockFile(path)
        except OSError:
            return None  # a read-only directory: no turns, as before
    return lock_file.fd


@contextmanager
def waiting(conn: BaseDatabaseWrapper | None = None) -> Iterator[None]:
    """Around a statement that may wait for the write lock: others see us waiting.

    Never blocks on the lock file itself: it is held exclusively only for the
    instant of another's look (``others_waiting``), and a process stopped in
    that instant must not stop every writer; then this wait goes unannounced.
    """
    fd = _descriptor(conn if conn is not None else default_connection)
    announced: int | None = None  # the descriptor flocked, once it is
    if fd is not None:
        for _ in range(3):
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                time.sleep(0)
                continue
            announced = fd
            break
    try:
        yield
    finally:
        if announced is not None:
            fcntl.flock(announced, fcntl.LOCK_UN)


def others_waiting(conn: BaseDatabaseWrapper | None = None) -> bool:
    """Is another thread or process waiting for the write lock right now?"""
    fd = _descriptor(conn if conn is not None else default_connection)
    if fd is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def give_way(conn: BaseDatabaseWrapper | None = None, *, limit: float = MAX_GIVE_WAY) -> float:
    """Before taking the write lock again: let every announced waiter go first.

    Returns the seconds spent waiting (0.0 when nobody was waiting). Inside a
    transaction it does nothing: this thread may hold the lock already, and
    waiting would only hold everyone up.
    """
    conn = conn if conn is not None else default_connection
    if conn.in_atomic_block or not others_waiting(conn):
        return 0.0
    started = time.monotonic()
    while time.monotonic() - started < limit:
        time.sleep(_POLL)
        if not others_waiting(conn):
            break
    return time.monotonic() - started


def _announce(execute: Execute, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
    """Django execute wrapper: statements that take the write lock announce their wait."""
    head = sql.lstrip()[:7].upper()
    conn: BaseDatabaseWrapper = context["connection"]
    if head.startswith("BEGIN") or (not conn.in_atomic_block and head.startswith(_WRITES)):
        with waiting(conn):
            return execute(sql, params, many, context)
    return execute(sql, params, many, context)


def install(sender: object, connection: BaseDatabaseWrapper, **kwargs: object) -> None:
    """``connection_created`` receiver: SQLite connections announce their writes.

    Inserted first, so that an ``execute_wrapper()`` block open while the
    connection was made still pops its own wrapper, not ours.
    """
    if turns_path(connection) is not None and _announce not in connection.execute_wrappers:
        connection.execute_wrappers.insert(0, _announce)
