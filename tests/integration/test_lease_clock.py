"""Lease writes that had to wait for the database's lock still commit a live lease.

Every test here uses ``transaction=True``: the lock is held by another thread's
connection, which must see the committed job, and the waiting write must not
already sit inside the test's own transaction (which would hold the lock itself).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime

import pytest
from django.db import connection, transaction

from durable import jobs, lease
from durable.models import Job, database_now

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 0.5  # seconds
HOLD = 1.5  # the lock is held this long: three leases


@contextmanager
def write_lock_held(job_id: int, seconds: float) -> Iterator[None]:
    """Another connection holds the lock a lease write needs for ``seconds``.

    SQLite: the database's one write lock (``BEGIN IMMEDIATE``), as an atomic unit
    or a large import batch of another process holds it. PostgreSQL: the job's row
    lock, as the holder's own atomic unit holds it.
    """
    locked, failed = threading.Event(), []

    def hold() -> None:
        try:
            with transaction.atomic():
                Job.objects.select_for_update().filter(pk=job_id).exists()
                locked.set()
                time.sleep(seconds)
        except Exception as exc:  # reported by the test, not lost in the thread
            failed.append(exc)
            locked.set()
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(10)
        assert not failed, failed
        yield
    finally:
        holder.join(30)


def claimed(lease_seconds: float = LEASE) -> lease.Lease:
    job = jobs.enqueue("test.append", {"units": 3})
    got = lease.claim(
        "holder", queues=["default"], operations=["test.append"], lease_seconds=lease_seconds
    )
    assert got is not None
    assert got[0].job_id == job.pk
    return got[0]


def delayed(write: Callable[[], object], job_id: int) -> tuple[datetime, datetime]:
    """Run ``write`` while the lock is held; return (its lease expiry, when it returned)."""
    with write_lock_held(job_id, HOLD):
        started = time.monotonic()
        write()
        waited = time.monotonic() - started
    returned = database_now()  # the clock leases are written with
    assert waited >= HOLD * 0.8, f"the write did not wait for the lock ({waited:.2f}s)"
    expires = Job.objects.get(pk=job_id).lease_expires_at
    assert expires is not None
    return expires, returned


SQLITE_ONLY = pytest.mark.skipif(
    connection.vendor != "sqlite",
    reason="PostgreSQL's claim and background renewal skip a locked row instead of waiting",
)


@SQLITE_ONLY
def test_claim__delayed_past_the_lease_by_the_write_lock_commits_a_future_expiry():
    job = jobs.enqueue("test.append", {"units": 3})
    expires, returned = delayed(
        lambda: lease.claim(
            "late", queues=["default"], operations=["test.append"], lease_seconds=LEASE
        ),
        job.pk,
    )
    assert Job.objects.get(pk=job.pk).lease_owner == "late"
    assert expires > returned, f"the claim wrote a lease {returned - expires} in the past"


def test_renew__delayed_past_the_lease_by_a_held_lock_commits_a_future_expiry():
    held = claimed()
    expires, returned = delayed(lambda: lease.renew(held, LEASE), held.job_id)
    assert expires > returned, f"the renewal wrote a lease {returned - expires} in the past"


@SQLITE_ONLY
def test_renew_unless_busy__delayed_past_the_lease_by_the_write_lock_commits_a_future_expiry():
    held = claimed()
    expires, returned = delayed(lambda: lease.renew_unless_busy(held, LEASE), held.job_id)
    assert expires > returned, f"the renewal wrote a lease {returned - expires} in the past"


@pytest.mark.parametrize("events", [False, True], ids=["direct", "with-events"])
def test_commit_unit__delayed_past_the_lease_by_a_held_lock_commits_a_future_expiry(events):
    held = claimed()

    def commit() -> None:
        lease.commit_unit(
            held,
            key="u0",
            result=None,
            checkpoint={"next": 1},
            units_total=3,
            events=[("note", "a unit's event", {})] if events else None,
            lease_seconds=LEASE,
        )

    expires, returned = delayed(commit, held.job_id)
    assert Job.objects.get(pk=held.job_id).units_done == 1
    assert expires > returned, f"the commit wrote a lease {returned - expires} in the past"
