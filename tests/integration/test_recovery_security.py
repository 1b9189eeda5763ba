"""The Security upsert against a caller's transaction and against concurrent writers.

``transaction=True`` throughout: each test has a second connection (a thread)
that must see committed rows, or a caller's transaction that must really
commit or roll back.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from durable import jobs
from durable.models import Job
from recovery.models import SecurityEvent
from recovery.policy import MAX_ACTORS, tally
from recovery.records import record_security, security

pytestmark = pytest.mark.django_db(transaction=True)

KIND = {"category": "ssrf", "key": "webhook.url", "cwe": 918, "source": "test"}
on_postgresql = pytest.mark.skipif(
    "connection.vendor != 'postgresql'", reason="a second connection can write while we hold one"
)
on_sqlite = pytest.mark.skipif(
    "connection.vendor != 'sqlite'", reason="SQLite defers to the commit; PostgreSQL does not"
)


class Rollback(Exception):
    pass


def rolled_back(body) -> None:
    """Run ``body`` in a transaction of the caller's, then give up, as callers of a refusal do."""
    with transaction.atomic():
        body()
        raise Rollback


def in_thread(target, *args):
    """Run ``target`` on a thread of its own (so: a connection of its own); return a handle."""
    box: dict = {}

    def run() -> None:
        try:
            box["result"] = target(*args)
        except BaseException as exc:  # re-raised by the test through box
            box["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def count_elsewhere() -> int | None:
    """The committed count, read on another connection."""
    thread, box = in_thread(
        lambda: (
            SecurityEvent.objects.filter(category="ssrf").values_list("count", flat=True).first()
        )
    )
    thread.join(10)
    return box.get("result")


# --- inside the caller's transaction ----------------------------------------


@on_postgresql
def test_inside_a_transaction_that_rolls_back__the_refusal_is_still_counted():
    returned = []

    def body() -> None:
        jobs.enqueue("durable.noop", {})
        returned.append(record_security(**KIND, username="alice", ip="192.0.2.1"))

    with pytest.raises(Rollback):
        rolled_back(body)
    assert returned[0].count == 1  # counted, and returned, before the rollback
    assert not Job.objects.exists()  # the caller's own write is undone...
    row = SecurityEvent.objects.get()  # ...the refusal is not
    assert (row.count, row.users, row.addresses) == (1, {"alice": 1}, {"192.0.2.1": 1})


@on_postgresql
def test_inside_a_transaction__the_row_is_not_locked_until_the_caller_commits():
    with transaction.atomic():
        record_security(**KIND, username="alice")
        # Another recorder (another request, another worker) is not held up by us...
        thread, box = in_thread(lambda: record_security(**KIND, username="bob"))
        thread.join(5)
        assert not thread.is_alive(), "a second recorder waited for the caller's transaction"
        assert box["result"].count == 2
        # ...and both counts are committed while our transaction is still open.
        assert count_elsewhere() == 2
    assert SecurityEvent.objects.get().users == {"alice": 1, "bob": 1}


@on_sqlite
def test_inside_a_transaction_on_sqlite__it_is_counted_when_the_caller_commits():
    with transaction.atomic():
        assert record_security(**KIND, username="alice") is None  # not written yet
        assert not SecurityEvent.objects.exists()
    assert SecurityEvent.objects.get().users == {"alice": 1}


@on_sqlite
def test_inside_a_transaction_on_sqlite__a_rollback_loses_it_as_documented():
    with pytest.raises(Rollback):
        rolled_back(lambda: record_security(**KIND))
    assert not SecurityEvent.objects.exists()


def test_inside_a_transaction__a_failing_record_never_raises_into_the_caller(monkeypatch, caplog):
    def broken(values):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(security, "_count_security", broken)
    with transaction.atomic():
        job = jobs.enqueue("durable.noop", {})
        assert record_security(**KIND) is None
        assert Job.objects.filter(pk=job.pk).exists()  # the caller's transaction goes on
    assert Job.objects.filter(pk=job.pk).exists()
    assert "could not record a security event" in caplog.text


def test_outside_a_transaction__the_row_comes_back_counted():
    first = record_security(**KIND, username="alice", ip="::ffff:198.51.100.7")
    again = record_security(**KIND, username="alice", ip="2001:db8::1", detail="the latest")
    assert (first.pk, again.pk) == (first.pk, first.pk)
    assert (again.count, again.users, again.detail) == (2, {"alice": 2}, "the latest")
    assert again.addresses == {"198.51.100.7": 1, "2001:db8::1": 1}
    assert (again.last_ipv4, again.last_ipv6) == ("198.51.100.7", "2001:db8::1")


# --- concurrent writers ----------------------------------------


def test_upsert__counts_on_the_row_as_a_concurrent_writer_left_it():
    """A recorder blocked by another writer's row lock adds to that writer's result.

    A read-modify-write (read the count, write count + 1) reads before the lock
    is released and writes back a stale count, losing the other writer's
    update — on both databases, since a plain read is never blocked. The
    single-statement upsert evaluates ``count + 1`` on the row it gets the lock
    on, so nothing is lost.
    """
    record_security(**KIND, username="alice")
    locked, go = threading.Event(), threading.Event()

    def other_writer() -> None:
        with transaction.atomic():
            row = SecurityEvent.objects.select_for_update().get()
            locked.set()
            assert go.wait(10)
            time.sleep(0.2)  # let the recorder get as far as it can before we commit
            SecurityEvent.objects.filter(pk=row.pk).update(count=row.count + 100)

    writer, writer_box = in_thread(other_writer)
    assert locked.wait(10)
    recorder, box = in_thread(lambda: record_security(**KIND, username="bob"))
    time.sleep(0.3)
    assert recorder.is_alive(), "the recorder did not wait for the row lock"
    go.set()
    writer.join(10)
    recorder.join(20)
    assert "error" not in writer_box, writer_box
    assert "error" not in box, box
    row = SecurityEvent.objects.get()
    assert row.count == 1 + 100 + 1
    assert row.users == {"alice": 1, "bob": 1}


def test_upsert__a_flood_of_one_kind_draws_no_id_per_refusal():
    for _ in range(5):
        record_security(**KIND)
    record_security(**{**KIND, "key": "other"})
    ids = sorted(SecurityEvent.objects.values_list("pk", flat=True))
    # An INSERT … ON CONFLICT per call would use a sequence value each time (PostgreSQL).
    assert ids[1] - ids[0] == 1


def test_upsert__the_sql_tally_is_policy_tally():
    """The capped tallies are computed in SQL; ``recovery.policy.tally`` states the rule.

    The same actors through both — repeats, the anonymous, past the cap, and
    known ones again after it: the row holds what folding ``tally`` gives, so
    the pure, table-tested rule and the upsert cannot drift apart.
    """
    users = [f"user{n % 7}" for n in range(10)] + [f"u{n}" for n in range(MAX_ACTORS + 5)]
    users += ["", "user3", "u0", f"u{MAX_ACTORS + 2}"]
    addresses = [f"198.51.100.{n % 60}" for n in range(len(users))]
    expected_users, expected_addresses, users_over, addresses_over = {}, {}, 0, 0
    for user, address in zip(users, addresses, strict=True):
        record_security(**KIND, username=user, ip=address)
        expected_users, extra = tally(expected_users, user)
        users_over += extra
        expected_addresses, extra = tally(expected_addresses, address)
        addresses_over += extra
    row = SecurityEvent.objects.get()
    assert (row.users, row.users_overflow) == (expected_users, users_over)
    assert (row.addresses, row.addresses_overflow) == (expected_addresses, addresses_over)
    assert users_over > 0  # the cap was reached
    assert addresses_over > 0
