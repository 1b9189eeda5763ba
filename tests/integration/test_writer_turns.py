"""Workers share the database's write lock fairly: nobody loses a job to someone else's units.

Real worker processes, nobody signalled while they work. On SQLite every write
needs the database's one write lock, and an atomic unit holds it while it runs;
a worker running such units back to back must still let the others' renewals,
claims, commits and start-up through. ``transaction=True``: the workers are
other processes and must see the test's rows.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.utils import timezone

from durable import jobs, rescue, turns
from durable.models import Job, WorkerProcess
from tests.conftest import wait_until
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def lines(path: Path, kind: str) -> Counter:
    if not path.exists():
        return Counter()
    rows = (line.split() for line in path.read_text().splitlines())
    return Counter(row[2] for row in rows if row[0] == kind)


SQLITE_ONLY = pytest.mark.skipif(
    connection.vendor != "sqlite", reason="SQLite's one write lock; PostgreSQL locks rows"
)


@SQLITE_ONLY
def test_turns__a_writer_waiting_for_the_lock_is_seen_and_given_way_to():
    """A thread stuck in BEGIN IMMEDIATE behind a held write lock is announced (through
    Django's cursor, no engine code involved), and give_way() waits until it got in."""
    got_in = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with transaction.atomic():
            Job.objects.exists()
            release.wait(10)
        connection.close()

    def wait_for_lock() -> None:
        with transaction.atomic():  # BEGIN IMMEDIATE: waits for the holder
            got_in.set()
        connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    time.sleep(0.2)
    assert not turns.others_waiting()
    waiter = threading.Thread(target=wait_for_lock)
    waiter.start()
    wait_until(turns.others_waiting, timeout=5)
    assert turns.give_way(limit=0.2) >= 0.2  # still waiting: give way only so long
    release.set()
    waited = turns.give_way(limit=10)
    assert waited < 5
    assert got_in.wait(2)  # the waiter had its turn
    assert not turns.others_waiting()
    for thread in (holder, waiter):
        thread.join(10)


@SQLITE_ONLY
def test_pulse__a_live_local_holder_keeps_its_expired_lease_until_its_pulse_is_old():
    """The holder is this very process: alive, not stopped. Its lease expired (its renewal
    is stuck behind the write lock, say), but its pulse is fresh: nobody takes the job."""
    WorkerProcess.objects.create(
        worker_id="alive-here",
        hostname="h",
        pid=os.getpid(),
        host_key=rescue.host_key(),
        lease_seconds=1.0,
    )
    job = jobs.enqueue("test.rows", {})
    Job.objects.filter(pk=job.pk).update(
        state="running",
        lease_owner="alive-here",
        lease_epoch=1,
        lease_expires_at=timezone.now() - timedelta(seconds=5),
    )
    rescue.pulse("alive-here")
    try:
        assert rescue.reclaim("peer") == []
        # A pulse older than the holder's lease: frozen, judged by its lease again.
        stale = time.time() - 1.5
        os.utime(rescue.pulse_path("alive-here"), (stale, stale))
        assert rescue.reclaim("peer") == [job.pk]
    finally:
        rescue.stop_pulse("alive-here")


@SQLITE_ONLY
def test_pulse__a_pulsing_worker_with_a_late_heartbeat_is_no_cold_start():
    """Its heartbeat is two leases late (stuck behind the write lock, say), but it
    pulses: a worker starting now is not a cold start and fails no left-over job."""
    left = jobs.enqueue("test.rows", {}, on_restart="fail")
    Job.objects.filter(pk=left.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    WorkerProcess.objects.create(
        worker_id="alive-here",
        hostname="h",
        pid=os.getpid(),
        host_key=rescue.host_key(),
        lease_seconds=1.0,
        heartbeat_at=timezone.now() - timedelta(minutes=1),
    )
    rescue.pulse("alive-here")
    try:
        report = rescue.recover_at_startup(
            "fresh", queues=["default"], concurrency=1, lease_seconds=1.0
        )
    finally:
        rescue.stop_pulse("alive-here")
    assert not report.cold_start
    assert Job.objects.get(pk=left.pk).state == "queued"


@SQLITE_ONLY
def test_pulse__files_of_long_dead_workers_are_pruned_at_start_up():
    rescue.pulse("killed-long-ago")
    rescue.pulse("alive-now")
    old = time.time() - 3 * 86400
    os.utime(rescue.pulse_path("killed-long-ago"), (old, old))
    try:
        rescue.recover_at_startup("fresh", queues=["default"], concurrency=1, lease_seconds=1.0)
        assert not rescue.pulse_path("killed-long-ago").exists()
        assert rescue.pulse_path("alive-now").exists()
    finally:
        rescue.stop_pulse("alive-now")


def test_atomic_units_back_to_back__a_long_unit_elsewhere_keeps_its_job(workers, tmp_path):
    """One worker runs short atomic units back to back; two others share a long ordinary
    unit with a short lease. The long unit runs once, nobody is reclaimed, no attempt is
    spent and no write fails with "database is locked"."""
    atomic_units, long_unit = 250, 5.0
    out = tmp_path / "long-unit.log"
    hog = jobs.enqueue("test.rows", {"units": atomic_units, "sleep": 0.08})
    long = jobs.enqueue("test.append", {"units": 1, "path": str(out), "sleep": long_unit})
    first = workers.start("--burst", "--operation", "test.rows", lease=1.0)
    wait_until(lambda: Job.objects.get(pk=hog.pk).units_done >= 3)
    # Started while the atomic units run: their registration, claim, renewals and
    # commit all need the write lock the atomic worker keeps taking.
    started = time.monotonic()
    peers = [workers.start("--operation", "test.append", lease=1.0) for _ in range(2)]
    wait_until(lambda: Job.objects.get(pk=long.pk).state == "completed", timeout=90)
    took = time.monotonic() - started
    assert first.wait(timeout=120) == 0, workers.log(first)
    for peer in peers:
        peer.send_signal(signal.SIGTERM)
    for peer in peers:
        assert peer.wait(timeout=20) == 0, workers.log(peer)

    long.refresh_from_db()
    hog.refresh_from_db()
    logs = "\n".join(workers.log(proc) for proc in [first, *peers])
    assert "database is locked" not in logs
    assert "lease lost" not in logs
    assert lines(out, "begin") == {"u0": 1}, "the long unit ran more than once"
    assert lines(out, "done") == {"u0": 1}
    assert (long.state, long.reclaims, long.attempts, long.errors) == ("completed", 0, 0, [])
    assert long.events.filter(kind="started").count() == 1
    assert (hog.state, hog.reclaims, hog.attempts) == ("completed", 0, 0)
    keys = Counter(SideEffect.objects.filter(job_id=hog.pk).values_list("key", flat=True))
    assert keys == {f"u{i}": 1 for i in range(atomic_units)}
    # The peers' start-up, claim, renewals and commit got their turns between atomic
    # units: the long job was done while those still ran (before, the peers waited
    # for the whole run of them), and the atomic worker's own heartbeat stayed fresh,
    # so the peers did not take it for dead (a "cold start" fails on_restart=fail jobs).
    assert long.finished_at < hog.finished_at, f"the long job took {took:.1f}s to finish"
    for peer in peers:
        assert "cold_start=false" in workers.log(peer)


def test_atomic_units_longer_than_a_lease__cost_others_time_not_their_jobs(workers, tmp_path):
    """An atomic unit holds SQLite's write lock for longer than the others' lease: their
    renewals wait past it. A live worker still keeps its job: nobody takes it back."""
    out = tmp_path / "long-unit.log"
    hog = jobs.enqueue("test.rows", {"units": 4, "sleep": 1.5})
    long = jobs.enqueue("test.append", {"units": 1, "path": str(out), "sleep": 4.0})
    first = workers.start("--burst", "--operation", "test.rows", lease=0.6)
    wait_until(lambda: Job.objects.get(pk=hog.pk).state == "running")
    peers = [workers.start("--operation", "test.append", lease=0.6) for _ in range(2)]
    wait_until(lambda: Job.objects.get(pk=long.pk).state == "completed", timeout=90)
    assert first.wait(timeout=60) == 0, workers.log(first)
    for peer in peers:
        peer.send_signal(signal.SIGTERM)
    for peer in peers:
        assert peer.wait(timeout=20) == 0, workers.log(peer)

    long.refresh_from_db()
    hog.refresh_from_db()
    logs = "\n".join(workers.log(proc) for proc in [first, *peers])
    assert "database is locked" not in logs
    assert "lease lost" not in logs
    assert lines(out, "begin") == {"u0": 1}, "the long unit ran more than once"
    assert (long.state, long.reclaims, long.attempts) == ("completed", 0, 0)
    assert (hog.state, hog.reclaims, hog.attempts) == ("completed", 0, 0)
