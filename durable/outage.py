"""A database outage as pure decisions: is this error one, what to log, when to look again.

When the database goes away (a failover, a restart, every connection cut), every
statement of every loop of a worker fails at once, and keeps failing until it is
back. Logged like any other error, that is a traceback per claim, renewal and
heartbeat, thousands of lines a minute that bury the one line that matters; and
backed off like any other error, the retry delay grows to the outage's length,
so a long outage is followed by a long wait after the database has returned.

So an error that says "the database cannot be reached" is told apart from the
rest (``is_unreachable``) and handled as the state of the connection it is:
one warning when it is lost, at most one reminder a minute while it stays lost,
one line when it is back with how long it was gone (``on_failure`` and
``on_success``, on a ``Reachability`` value), no traceback — the traceback of
a refused connection tells nobody anything. Meanwhile the loops look again
every second at most (``retry_delay``), whatever the outage's length, so work
resumes within about a second of the database's return. Any other error keeps
its traceback and its growing backoff.

No clock is read here and nothing is logged: the caller passes ``now`` and
writes the ``Note`` it gets back (``durable.dbwatch`` does both for a process).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg

# PostgreSQL SQLSTATEs that mean "no usable connection", whatever the statement:
# class 08 (connection exception) by prefix, and these.
UNREACHABLE_SQLSTATES = frozenset(
    {
        "57P01",  # admin_shutdown: pg_terminate_backend, a fast shutdown
        "57P02",  # crash_shutdown: another backend crashed, the server restarts
        "57P03",  # cannot_connect_now: starting up, shutting down, in recovery
        "53300",  # too_many_connections: refused until one is free
    }
)
# SQLite: the file cannot be opened (a lost mount, a missing directory). "database is
# locked" (SQLITE_BUSY) is not here: that is a writer's turn, not an outage.
UNREACHABLE_SQLITE = frozenset({"SQLITE_CANTOPEN"})

REMINDER_SECONDS = 60.0  # at most one line a minute while the database stays unreachable
OUTAGE_POLL_SECONDS = 1.0  # the longest wait between two looks while it is unreachable
FIRST_RETRY_SECONDS = 0.1  # the first look again after a lost connection
MAX_ERROR_CHARS = 200
CHAIN_DEPTH = 8  # __cause__/__context__ links followed (Django wraps the driver's error)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it was raised from or while handling, nearest first."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < CHAIN_DEPTH:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot be reached, as opposed to refusing a statement.

    Decided by the driver's error, which Django keeps as ``__cause__`` of its own:
    psycopg's client-side connection failures carry no SQLSTATE (refused, reset,
    closed by the server, "the connection is closed"); the server's own say so
    by their SQLSTATE. A lock timeout, a cancelled statement, a serialization
    failure or a constraint are ``OperationalError``\\ s too, and are not outages.
    """
    for error in _chain(exc):
        if isinstance(error, psycopg.Error):
            state = error.sqlstate
            if state is None:
                return isinstance(error, psycopg.OperationalError | psycopg.InterfaceError)
            return state.startswith("08") or state in UNREACHABLE_SQLSTATES
        if isinstance(error, sqlite3.Error):
            return getattr(error, "sqlite_errorname", "") in UNREACHABLE_SQLITE
    return False


def describe(exc: BaseException) -> str:
    """The error on one short line, for a log field."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:MAX_ERROR_CHARS]


@dataclass(frozen=True)
class Note:
    """A log line to write: its level, message and fields."""

    level: int
    message: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Reachability:
    """What a process knows of its database: reachable, or unreachable since when.

    ``down_since`` and ``said_at`` are readings of the caller's monotonic clock.
    """

    down_since: float | None = None
    said_at: float | None = None  # when the last line about this outage was written
    failures: int = 0  # failed statements since it was lost (every loop counts)

    @property
    def down(self) -> bool:
        return self.down_since is not None


def on_failure(state: Reachability, now: float, error: str) -> tuple[Reachability, Note | None]:
    """A statement failed because the database is unreachable: the new state, and a line
    to write if one is due (the first failure; then one a minute)."""
    if state.down_since is None:
        note = Note(logging.WARNING, "database unreachable", {"error": error})
        return Reachability(down_since=now, said_at=now, failures=1), note
    failures = state.failures + 1
    if state.said_at is not None and now - state.said_at < REMINDER_SECONDS:
        return replace(state, failures=failures), None
    note = Note(
        logging.WARNING,
        "database still unreachable",
        {"down_for": round(now - state.down_since, 1), "failures": failures, "error": error},
    )
    return replace(state, said_at=now, failures=failures), note


def on_success(
    state: Reachability, now: float, *, began: float | None = None
) -> tuple[Reachability, Note | None]:
    """A statement went through: if the database was lost, it is back (one line).

    ``began``: when that statement was sent. One sent before the database was
    lost says nothing of it now — another thread's success that was merely
    reported after this thread's failure — and is ignored.
    """
    if state.down_since is None:
        return state, None
    if began is not None and began < state.down_since:
        return state, None
    note = Note(
        logging.INFO,
        "database reachable again",
        {"down_for": round(now - state.down_since, 1), "failures": state.failures},
    )
    return Reachability(), note


def retry_delay(
    failures: int, *, unreachable: bool, base: float, cap: float, spread: float = 1.0
) -> float:
    """How long a loop waits after its ``failures``-th failure in a row (counted from 1).

    Unreachable: 0.1 s, doubling, at most ``OUTAGE_POLL_SECONDS`` — a look every
    second however long the outage, so its end is seen within a second. Any
    other error: ``base`` doubling up to ``cap`` (a statement the database
    refuses will likely be refused again). ``spread`` (in [0, 1], the caller's
    random draw) takes up to a quarter off, so loops that failed together do
    not all look again at the same instant.
    """
    if failures < 1:
        raise ValueError("failures counts from 1")
    start, ceiling = (FIRST_RETRY_SECONDS, OUTAGE_POLL_SECONDS) if unreachable else (base, cap)
    delay = min(ceiling, start * 2.0 ** min(failures - 1, 62))
    return delay * (0.75 + 0.25 * min(max(spread, 0.0), 1.0))
