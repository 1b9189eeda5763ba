"""durable.outage: which errors are an outage, what is logged through one, when to look again."""

from __future__ import annotations

import logging
import sqlite3
import threading

import psycopg
import psycopg.errors
import pytest
from django.db import utils as django_db

from durable.dbwatch import DatabaseWatch
from durable.outage import (
    OUTAGE_POLL_SECONDS,
    REMINDER_SECONDS,
    Reachability,
    describe,
    is_unreachable,
    on_failure,
    on_success,
    retry_delay,
)
from durable.signals import EngineSignal, send_now
from durable.worker.housekeeping import RECLAIM_GRACE_SECONDS, reclaim_due


def _sqlite_error(name: str) -> sqlite3.Error:
    error = sqlite3.OperationalError("x")
    error.sqlite_errorname = name  # type: ignore[attr-defined]
    return error


def _wrapped(driver_error: Exception) -> Exception:
    """As Django raises it: its own class, the driver's error as the cause."""
    try:
        try:
            raise driver_error
        except Exception as exc:
            raise django_db.OperationalError(str(exc)) from exc
    except Exception as outer:
        return outer


@pytest.mark.parametrize(
    ("error", "unreachable"),
    [
        # refused, reset, server gone: psycopg says so without a SQLSTATE
        (psycopg.OperationalError("connection failed: Connection refused"), True),
        (psycopg.OperationalError("the connection is closed"), True),
        (psycopg.InterfaceError("the connection is lost"), True),
        # the same as Django raises them (wrapped, the driver's error as the cause)
        (_wrapped(psycopg.OperationalError("server closed the connection unexpectedly")), True),
        (_wrapped(psycopg.errors.AdminShutdown("terminating connection")), True),  # 57P01
        (psycopg.errors.ConnectionFailure("x"), True),  # class 08
        (psycopg.errors.CannotConnectNow("the database system is starting up"), True),
        (psycopg.errors.TooManyConnections("too many clients"), True),
        # OperationalErrors that are about the statement, not the connection
        (psycopg.errors.LockNotAvailable("lock timeout"), False),  # 55P03
        (psycopg.errors.QueryCanceled("statement timeout"), False),  # 57014
        (psycopg.errors.SerializationFailure("could not serialize"), False),  # 40001
        (_wrapped(psycopg.errors.DeadlockDetected("deadlock")), False),
        (psycopg.errors.UniqueViolation("duplicate key"), False),
        (psycopg.ProgrammingError("syntax"), False),
        # SQLite: a file that cannot be opened is an outage; a busy lock is not
        (_sqlite_error("SQLITE_CANTOPEN"), True),
        (_sqlite_error("SQLITE_BUSY"), False),
        (sqlite3.OperationalError("database is locked"), False),
        # not a database error at all
        (ValueError("no"), False),
        (django_db.OperationalError("raised by Django alone"), False),
    ],
)
def test_is_unreachable__tells_a_lost_connection_from_a_refused_statement(error, unreachable):
    assert is_unreachable(error) is unreachable


def test_is_unreachable__follows_the_context_of_an_error_raised_while_handling_one():
    caught: list[BaseException] = []
    try:
        try:
            raise psycopg.OperationalError("the connection is closed")
        except Exception:
            raise RuntimeError("the unit could not record its result") from None
    except RuntimeError as exc:
        caught.append(exc)
    # "from None" hides the cause from the traceback; the context is still there
    assert is_unreachable(caught[0]) is True


def test_is_unreachable__stops_on_a_cycle_in_the_chain():
    first, second = RuntimeError("a"), RuntimeError("b")
    first.__context__, second.__context__ = second, first
    assert is_unreachable(first) is False


def test_describe__one_short_line():
    text = describe(psycopg.OperationalError("connection failed:\n\tIs the server running?" * 20))
    assert "\n" not in text
    assert "\t" not in text
    assert len(text) <= 200


T0 = 1000.0


@pytest.mark.parametrize(
    ("events", "lines"),
    [
        # (event, seconds after T0) -> the lines written, in order
        ([("fail", 0)], [(logging.WARNING, "database unreachable")]),
        # a thousand failures in the first minute: still one line
        (
            [("fail", 0), *[("fail", n * 0.05) for n in range(1, 1000)]],
            [(logging.WARNING, "database unreachable")],
        ),
        # then one reminder a minute, whoever fails
        (
            [("fail", 0), ("fail", 30), ("fail", 61), ("fail", 90), ("fail", 122)],
            [
                (logging.WARNING, "database unreachable"),
                (logging.WARNING, "database still unreachable"),
                (logging.WARNING, "database still unreachable"),
            ],
        ),
        # back: one line; a second success says nothing
        (
            [("fail", 0), ("fail", 1), ("ok", 8.2), ("ok", 9)],
            [(logging.WARNING, "database unreachable"), (logging.INFO, "database reachable again")],
        ),
        # reachable all along: nothing
        ([("ok", 0), ("ok", 1)], []),
        # two outages: each its pair
        (
            [("fail", 0), ("ok", 8), ("fail", 20), ("ok", 60)],
            [
                (logging.WARNING, "database unreachable"),
                (logging.INFO, "database reachable again"),
                (logging.WARNING, "database unreachable"),
                (logging.INFO, "database reachable again"),
            ],
        ),
    ],
)
def test_outage_lines__one_when_lost_one_a_minute_one_when_back(events, lines):
    state, written = Reachability(), []
    for event, at in events:
        if event == "fail":
            state, note = on_failure(state, T0 + at, "refused")
        else:
            state, note = on_success(state, T0 + at)
        if note is not None:
            written.append((note.level, note.message))
    assert written == lines


def test_on_success__says_how_long_it_was_gone_and_how_many_statements_failed():
    state, _ = on_failure(Reachability(), T0, "refused")
    for n in range(1, 5):
        state, _ = on_failure(state, T0 + n, "refused")
    state, note = on_success(state, T0 + 40.04)
    assert note is not None
    assert note.fields == {"down_for": 40.0, "failures": 5}
    assert state == Reachability()


def test_on_failure__the_reminder_says_since_when():
    state, first = on_failure(Reachability(), T0, "refused")
    assert first is not None
    assert first.fields == {"error": "refused"}
    state, note = on_failure(state, T0 + REMINDER_SECONDS + 0.5, "refused again")
    assert note is not None
    assert note.fields == {"down_for": 60.5, "failures": 2, "error": "refused again"}
    assert state.down_since == T0  # the outage started at the first failure


@pytest.mark.parametrize(
    ("failures", "unreachable", "expected"),
    [
        (1, True, 0.1),  # a lost connection: look again at once
        (2, True, 0.2),
        (4, True, 0.8),
        (5, True, OUTAGE_POLL_SECONDS),  # then every second...
        (500, True, OUTAGE_POLL_SECONDS),  # ...however long the outage
        (1, False, 1.0),  # another error: base...
        (3, False, 4.0),  # ...doubling...
        (10, False, 30.0),  # ...up to the cap
        (10_000, False, 30.0),  # no overflow
    ],
)
def test_retry_delay__capped_at_a_second_through_an_outage(failures, unreachable, expected):
    delay = retry_delay(failures, unreachable=unreachable, base=1.0, cap=30.0)
    assert delay == pytest.approx(expected)


@pytest.mark.parametrize("spread", [0.0, 0.3, 1.0, -1.0, 2.0])
def test_retry_delay__spread_takes_at_most_a_quarter_off(spread):
    delay = retry_delay(9, unreachable=True, base=1.0, cap=30.0, spread=spread)
    assert OUTAGE_POLL_SECONDS * 0.75 <= delay <= OUTAGE_POLL_SECONDS


def test_retry_delay__counts_from_one():
    with pytest.raises(ValueError, match="counts from 1"):
        retry_delay(0, unreachable=True, base=1.0, cap=30.0)


# --- durable.dbwatch: the same, for every thread of a process -------------------------------


def test_database_watch__many_threads_failing_write_one_warning_and_one_return(caplog):
    now = [T0]
    watch = DatabaseWatch(logging.getLogger("durable.test"), clock=lambda: now[0], worker="w1")
    lost = psycopg.OperationalError("connection failed: Connection refused")

    def loop() -> None:
        for _ in range(200):
            assert watch.failed(lost, "claim failed; retrying") is True

    caplog.set_level(logging.INFO, logger="durable.test")
    threads = [threading.Thread(target=loop) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert watch.down
    now[0] += 8.0
    watch.succeeded()
    watch.succeeded()
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "database unreachable"),
        (logging.INFO, "database reachable again"),
    ]
    back = caplog.records[-1]
    assert (back.worker, back.down_for, back.failures) == ("w1", 8.0, 1600)
    assert not any(r.exc_info for r in caplog.records)  # no traceback for a lost connection


def test_database_watch__any_other_error_is_logged_with_its_traceback(caplog):
    watch = DatabaseWatch(logging.getLogger("durable.test"), worker="w1")
    caplog.set_level(logging.INFO, logger="durable.test")
    assert watch.failed(psycopg.errors.LockNotAvailable("lock"), "claim failed", n=1) is False
    (record,) = caplog.records
    assert (record.getMessage(), record.worker, record.n) == ("claim failed", "w1", 1)
    assert record.exc_info is not None
    assert not watch.down


# --- durable.signals.send_now: a receiver failing through an outage ----------------------------


def _signal_with(*errors: Exception) -> EngineSignal:
    signal = EngineSignal()
    calls = []

    def make(error: Exception):
        def receiver(sender: object, **kwargs: object) -> None:
            calls.append(error)
            raise error

        return receiver

    signal.receivers_kept = [make(error) for error in errors]  # type: ignore[attr-defined]
    for receiver in signal.receivers_kept:  # type: ignore[attr-defined]
        signal.connect(receiver, weak=False)
    signal.calls = calls  # type: ignore[attr-defined]
    return signal


def test_send_now__an_unreachable_database_is_one_line_without_a_traceback(caplog):
    signal = _signal_with(psycopg.OperationalError("the connection is closed"))
    caplog.set_level(logging.INFO)  # every logger: Django's own (django.dispatch) too
    send_now(signal, worker_id="w")
    (record,) = caplog.records
    assert record.getMessage() == "signal receiver failed: database unreachable"
    assert record.exc_info is None
    assert record.error == "the connection is closed"


def test_send_now__any_other_failure_keeps_its_traceback(caplog):
    signal = _signal_with(KeyError("bug"))
    caplog.set_level(logging.INFO)  # every logger: Django's own (django.dispatch) too
    send_now(signal, worker_id="w")
    (record,) = caplog.records
    assert record.getMessage() == "signal receiver failed"
    assert record.exc_info is not None


def test_send_now__raise_unreachable_hands_the_outage_to_the_caller_after_every_receiver(caplog):
    lost = psycopg.OperationalError("the connection is closed")
    signal = _signal_with(lost, KeyError("bug"), psycopg.InterfaceError("lost too"))
    caplog.set_level(logging.INFO)  # every logger: Django's own (django.dispatch) too
    with pytest.raises(psycopg.OperationalError) as raised:
        send_now(signal, raise_unreachable=True, worker_id="w")
    assert raised.value is lost  # the first one
    assert len(signal.calls) == 3  # type: ignore[attr-defined]
    # the bug is still logged, with its traceback; the outage is not
    assert [r.getMessage() for r in caplog.records] == ["signal receiver failed"]


# --- the worker's housekeeping: no reclaim right after an outage -----------------------------


@pytest.mark.parametrize(
    ("now", "stopping", "lost_for", "database_back", "due"),
    [
        (100.0, False, None, True, True),  # its time, nothing lost: reclaim
        (99.0, False, None, True, False),  # not its time yet
        (100.0, True, None, True, False),  # the worker is stopping
        (100.0, False, None, False, False),  # down, or back less than the grace ago
        (100.0, False, 1.0, True, False),  # this loop lost it a second ago: peers still renewing
        (100.0, False, RECLAIM_GRACE_SECONDS, True, True),  # back long enough
    ],
)
def test_reclaim_due__waits_a_grace_after_the_database_is_back(
    now, stopping, lost_for, database_back, due
):
    found = reclaim_due(
        now, 100.0, stopping=stopping, lost_for=lost_for, database_back=database_back
    )
    assert found is due


def test_database_watch__tells_when_the_database_came_back():
    now = [T0]
    watch = DatabaseWatch(logging.getLogger("durable.test"), clock=lambda: now[0])
    assert not watch.returned_within(5)
    watch.failed(psycopg.OperationalError("the connection is closed"), "x")
    assert watch.down
    assert not watch.returned_within(5)
    now[0] += 40
    watch.succeeded()
    assert watch.returned_within(5)
    now[0] += 5
    assert not watch.returned_within(5)


def test_database_watch__the_outage_to_look_back_on_is_given_once_after_the_return():
    wall = [5000.0]
    watch = DatabaseWatch(
        logging.getLogger("durable.test"), clock=lambda: wall[0], wall_clock=lambda: wall[0]
    )
    lost = psycopg.OperationalError("the connection is closed")
    watch.failed(lost, "x")
    wall[0] += 3
    watch.failed(lost, "x")  # the same outage: it began at the first failure
    assert watch.outage_to_look_back_on() is None  # not over yet
    wall[0] += 10
    watch.succeeded()
    assert watch.outage_to_look_back_on() == 5000.0
    assert watch.outage_to_look_back_on() is None  # once


@pytest.mark.parametrize(
    ("began", "back"),
    [
        (T0 - 0.01, False),  # sent before the outage began, reported after: says nothing
        (T0, True),  # sent as it began (the same reading): counts
        (T0 + 2, True),  # sent during the outage and went through: it is back
        (None, True),  # no start given: taken as it comes
    ],
)
def test_on_success__a_success_sent_before_the_outage_began_is_not_a_return(began, back):
    state, _ = on_failure(Reachability(), T0, "refused")
    state, note = on_success(state, T0 + 3, began=began)
    assert (note is not None, state.down) == (back, not back)
