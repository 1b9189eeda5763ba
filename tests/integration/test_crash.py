"""Real worker subprocesses, killed for real: SIGKILL, SIGSTOP/SIGCONT, SIGTERM.

Every test here uses ``transaction=True``: the workers are other processes with
their own connections, so the test's rows must really be committed.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from durable import jobs
from durable.models import Job, WorkerProcess
from tests.conftest import wait_until
from tests.testapp.models import SideEffect

from .helpers import drain

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def done_lines(path: Path) -> Counter:
    if not path.exists():
        return Counter()
    return Counter(
        line.split()[2] for line in path.read_text().splitlines() if line.startswith("done ")
    )


def proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0]


def test_worker__runs_jobs_to_completion(workers):
    created = [jobs.enqueue("test.rows", {"units": 5}).pk for _ in range(3)]
    proc = workers.run()
    assert proc.returncode == 0, workers.log(proc)
    assert set(Job.objects.filter(pk__in=created).values_list("state", flat=True)) == {"completed"}
    assert SideEffect.objects.count() == 15


def test_worker_id__a_restart_with_the_same_id_gets_a_fresh_identity(workers):
    """A pod restarted with a fixed --worker-id must start, not die on the registry's key."""
    jobs.enqueue("test.rows", {"units": 1})
    first = workers.run("--worker-id", "pod-1")
    assert first.returncode == 0, workers.log(first)
    jobs.enqueue("test.rows", {"units": 1})
    second = workers.run("--worker-id", "pod-1")
    assert second.returncode == 0, workers.log(second)
    ids = list(WorkerProcess.objects.values_list("worker_id", flat=True))
    assert len(set(ids)) == 2
    assert all(worker_id.startswith("pod-1:") for worker_id in ids)
    owners = set(Job.objects.values_list("events__data__worker", flat=True)) - {None}
    assert owners == set(ids)  # each start claimed under its own identity


def test_worker__refuses_to_start_with_an_engine_setting_out_of_range(workers):
    """runworker skips Django's full checks (they import every view) but not the engine's."""
    job = jobs.enqueue("test.rows", {"units": 1})
    refused = workers.run(env={"DURABLE_UNIT_TARGET_SECONDS": "0.001"})
    assert refused.returncode != 0
    assert "durable.E003" in workers.log(refused)
    assert Job.objects.get(pk=job.pk).state == "queued"  # nothing claimed


def test_crash_before_checkpoint__repeats_that_one_unit_not_the_job(workers, tmp_path):
    out = tmp_path / "side-effects.log"
    job = jobs.enqueue("test.append", {"units": 5, "path": str(out)})
    crashed = workers.run(faults="after_unit:3")  # SIGKILL after u2's side effect
    assert crashed.returncode == -signal.SIGKILL
    job.refresh_from_db()
    assert (job.state, job.checkpoint) == ("running", {"next": 2})

    restarted = workers.run()
    assert restarted.returncode == 0, workers.log(restarted)
    job.refresh_from_db()
    assert job.state == "completed"
    # An external side effect with no idempotency check is at-least-once per unit:
    # the unit that crashed ran twice, every other unit exactly once.
    assert done_lines(out) == {"u0": 1, "u1": 1, "u2": 2, "u3": 1, "u4": 1}
    assert job.reclaims == 1
    assert job.events.filter(kind="reclaimed").count() == 1


def test_crash_before_checkpoint__atomic_units_are_exactly_once(workers):
    job = jobs.enqueue("test.rows", {"units": 5})
    assert workers.run(faults="after_unit:3").returncode == -signal.SIGKILL
    assert workers.run().returncode == 0
    job.refresh_from_db()
    assert job.state == "completed"
    keys = Counter(SideEffect.objects.filter(job_id=job.pk).values_list("key", flat=True))
    assert keys == {f"u{i}": 1 for i in range(5)}


# Where each worker of the progress test dies; each point leaves at least one unit
# committed by that worker's lease: (fault, units it commits).
KILLED_AFTER_PROGRESS = [
    ("after_checkpoint:1", 1),  # right after its first commit
    ("after_unit:2", 1),  # in its second unit's transaction, which is rolled back
    ("before_unit:2", 1),  # about to run its second unit
    ("after_checkpoint:2", 2),
]


def test_worker_deaths_after_progress__spend_no_attempt_and_the_job_completes(workers):
    """A long job whose worker is SIGKILLed again and again while it moves on (a deploy,
    the OOM killer, a lost node) is never failed by those deaths."""
    kills = 15
    plan = [KILLED_AFTER_PROGRESS[n % len(KILLED_AFTER_PROGRESS)] for n in range(kills)]
    units = sum(committed for _, committed in plan) + 3
    job = jobs.enqueue("test.rows", {"units": units}, max_attempts=2)
    for fault, _ in plan:
        # Each new worker takes the job back at once (the last one's PID is gone).
        killed = workers.run(faults=fault)
        assert killed.returncode == -signal.SIGKILL, workers.log(killed)
    finished = workers.run()
    assert finished.returncode == 0, workers.log(finished)
    job.refresh_from_db()
    assert job.state == "completed", job.reason
    assert (job.attempts, job.reclaims) == (0, kills)
    keys = Counter(SideEffect.objects.filter(job_id=job.pk).values_list("key", flat=True))
    assert keys == {f"u{i}": 1 for i in range(units)}  # atomic: each unit exactly once
    reclaimed = list(job.events.filter(kind="reclaimed").order_by("seq"))
    assert len(reclaimed) == kills
    assert [e.data["units_committed"] for e in reclaimed] == [c for _, c in plan]
    assert {e.data["attempt_spent"] for e in reclaimed} == {False}
    lost = [e for e in job.errors if e["error_class"] == "WorkerLost"]
    assert len(lost) == kills  # each death is on record
    assert {e["attempt_spent"] for e in lost} == {False}


def test_worker_deaths_before_any_commit__fail_the_job_after_max_attempts(workers):
    """A unit that kills its worker every time still stops the job, after max_attempts
    deaths without progress; the death that came after progress is not among them."""
    job = jobs.enqueue("test.rows", {"units": 6}, max_attempts=3)
    first = workers.run(faults="after_unit:3")  # commits u0 and u1, dies in u2
    assert first.returncode == -signal.SIGKILL, workers.log(first)
    for _ in range(3):
        poisoned = workers.run(faults="after_unit:1")  # dies in u2 again, before any commit
        assert poisoned.returncode == -signal.SIGKILL, workers.log(poisoned)
    last = workers.run()  # takes the job back from the third poisoned worker: exhausted
    assert last.returncode == 0, workers.log(last)
    job.refresh_from_db()
    assert (job.state, job.error_code, job.attempts, job.reclaims) == (
        "failed",
        "exhausted",
        3,
        4,
    )
    assert job.reason.startswith("its worker stopped 3 times without committing a unit")
    assert job.checkpoint == {"next": 2}
    keys = Counter(SideEffect.objects.filter(job_id=job.pk).values_list("key", flat=True))
    assert keys == {"u0": 1, "u1": 1}
    lost = [e for e in job.errors if e["error_class"] == "WorkerLost"]
    assert [e["attempt_spent"] for e in lost] == [False, True, True, True]


def test_crash_after_side_effect__a_checking_unit_does_not_repeat_it(workers, tmp_path):
    out = tmp_path / "side-effects.log"
    job = jobs.enqueue("test.append", {"units": 4, "path": str(out), "idempotent": True})
    assert workers.run(faults="after_unit:2").returncode == -signal.SIGKILL
    assert workers.run().returncode == 0
    job.refresh_from_db()
    assert job.state == "completed"
    assert done_lines(out) == {"u0": 1, "u1": 1, "u2": 1, "u3": 1}


def test_crash_after_checkpoint__nothing_is_repeated(workers, tmp_path):
    out = tmp_path / "side-effects.log"
    job = jobs.enqueue("test.append", {"units": 4, "path": str(out)})
    assert workers.run(faults="after_checkpoint:2").returncode == -signal.SIGKILL
    assert workers.run().returncode == 0
    job.refresh_from_db()
    assert job.state == "completed"
    assert done_lines(out) == {"u0": 1, "u1": 1, "u2": 1, "u3": 1}


def test_stale_worker__cannot_advance_the_checkpoint_after_its_lease_expired(workers, tmp_path):
    out = tmp_path / "side-effects.log"
    job = jobs.enqueue("test.append", {"units": 4, "path": str(out)})
    stale = workers.start("--burst", "--max-jobs", "1", faults="after_unit:2:stop", lease=1.0)
    wait_until(lambda: proc_state(stale.pid) == "T")  # stopped after u1's side effect
    job.refresh_from_db()
    assert job.checkpoint == {"next": 1}
    epoch = job.lease_epoch
    wait_until(lambda: Job.objects.get(pk=job.pk).lease_expires_at < timezone.now(), timeout=10)

    # A worker that only runs restart recovery (it has no matching operation to claim).
    rescuer = workers.run("--operation", "durable.noop")
    assert rescuer.returncode == 0
    job.refresh_from_db()
    assert (job.state, job.lease_owner, job.checkpoint) == ("queued", None, {"next": 1})

    os.kill(stale.pid, signal.SIGCONT)
    assert stale.wait(timeout=20) == 0
    assert "lease lost" in workers.log(stale)
    job.refresh_from_db()
    assert (job.state, job.checkpoint, job.units_done) == ("queued", {"next": 1}, 1)

    assert workers.run().returncode == 0
    job.refresh_from_db()
    assert job.state == "completed"
    assert job.lease_epoch == epoch + 1
    assert done_lines(out)["u1"] == 2  # the stale worker's side effect, then the replay


def begin_lines(path: Path) -> Counter:
    return Counter(
        line.split()[2] for line in path.read_text().splitlines() if line.startswith("begin ")
    )


def test_renewal__a_unit_longer_than_the_lease_keeps_its_job(workers, tmp_path):
    """Only the background renewal keeps a 3 s unit's 1 s lease alive while a peer looks on."""
    out = tmp_path / "side-effects.log"
    job = jobs.enqueue("test.append", {"units": 2, "path": str(out), "sleep": 3})
    holder = workers.start("--burst", lease=1.0)
    wait_until(lambda: out.exists())  # u0 has begun
    peer = workers.start(lease=1.0)  # claims nothing (the job is leased); reclaims every 0.5 s
    assert holder.wait(timeout=60) == 0, workers.log(holder)
    peer.send_signal(signal.SIGTERM)
    assert peer.wait(timeout=10) == 0, workers.log(peer)
    job.refresh_from_db()
    assert job.state == "completed"
    assert job.reclaims == 0, workers.log(peer)
    assert begin_lines(out) == {"u0": 1, "u1": 1}  # one begin per unit: never run twice
    assert done_lines(out) == {"u0": 1, "u1": 1}
    assert job.events.filter(kind="started").count() == 1


PG_ONLY = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="PostgreSQL row locks; on SQLite a long atomic unit holds the database's one "
    "write lock and every writer waits for it (keep atomic units short: "
    'docs/explanation/sqlite.md, "One writer at a time")',
)


@PG_ONLY
def test_renewal__an_atomic_unit_holding_its_row_does_not_stall_other_leases(workers, tmp_path):
    """The renewal thread must not wait for the row lock its own process's atomic unit holds:
    meanwhile the process's other leases and its heartbeat must stay fresh."""
    out = tmp_path / "side-effects.log"
    other = jobs.enqueue("test.append", {"units": 2, "path": str(out), "sleep": 2})
    atomic = jobs.enqueue("test.rows", {"units": 1, "sleep": 4})
    holder = workers.start("--burst", "--concurrency", "2", lease=1.0)
    wait_until(
        lambda: set(Job.objects.values_list("state", flat=True)) == {"running"} and out.exists()
    )
    lapsed, silent = [], []
    while holder.poll() is None:
        with connection.cursor() as cursor:  # on the database clock, as leases are written
            cursor.execute(
                "SELECT count(*) FROM durable_job WHERE id = %s AND state = 'running' "
                "AND lease_expires_at < clock_timestamp()",
                [other.pk],
            )
            lapsed.append(cursor.fetchone()[0])
            cursor.execute(
                "SELECT extract(epoch FROM clock_timestamp() - heartbeat_at) "
                "FROM durable_workerprocess WHERE pid = %s",
                [holder.pid],
            )
            silent.append(float(cursor.fetchone()[0]))
        time.sleep(0.05)
    assert holder.returncode == 0, workers.log(holder)
    assert not any(lapsed), "the other job's lease lapsed while the atomic unit ran"
    assert max(silent) < 2.0, f"the heartbeat went silent for {max(silent):.1f}s"
    for job in (atomic, other):
        job.refresh_from_db()
        assert (job.state, job.reclaims) == ("completed", 0), workers.log(holder)
    assert begin_lines(out) == {"u0": 1, "u1": 1}
    assert SideEffect.objects.filter(job_id=atomic.pk).count() == 1


@PG_ONLY
def test_reclaim__does_not_wait_for_a_row_another_transaction_holds():
    """A rescuer meeting a locked expired lease (a stalled holder mid-unit) skips it."""
    from durable import rescue

    job = jobs.enqueue("test.rows", {})
    Job.objects.filter(pk=job.pk).update(
        state="running",
        lease_owner="stalled",
        lease_epoch=1,
        lease_expires_at=timezone.now() - timezone.timedelta(seconds=5),
    )
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:  # what fence() does inside a stalled worker's atomic unit
        from django.db import transaction

        with transaction.atomic():
            Job.objects.select_for_update().get(pk=job.pk)
            locked.set()
            release.wait(10)
        connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(5)
        started = time.monotonic()
        assert rescue.reclaim("rescuer") == []
        assert time.monotonic() - started < 2
    finally:
        release.set()
        holder.join(10)
    assert rescue.reclaim("rescuer") == [job.pk]  # once the holder lets go


def test_unit_timeout__a_unit_that_stops_when_asked_spends_an_attempt(workers, tmp_path):
    out = tmp_path / "side-effects.log"
    job = jobs.enqueue(
        "test.overrun", {"units": 1, "path": str(out), "sleep": 30, "cooperative": True}
    )
    proc = workers.start(lease=1.0)
    wait_until(lambda: Job.objects.get(pk=job.pk).state == "completed", timeout=30)
    assert proc.poll() is None  # the unit stopped, so its worker had no reason to leave
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0, workers.log(proc)
    job.refresh_from_db()
    assert (job.state, job.attempts, job.reclaims) == ("completed", 1, 0)
    assert job.errors[0]["error_class"] == "durable.errors.UnitTimeout"
    assert begin_lines(out) == {"u0": 2}  # stopped at the timeout, then run again in full
    assert done_lines(out) == {"u0": 1}


def test_unit_timeout__a_hung_unit_ends_its_process_before_anyone_may_run_it_again(
    workers, tmp_path
):
    """Never two at once: the lease is kept until the process that runs the unit is gone."""
    from durable.worker import EXIT_UNIT_TIMEOUT

    out = tmp_path / "side-effects.log"
    job = jobs.enqueue("test.overrun", {"units": 1, "path": str(out), "sleep": 30})
    hung = workers.start("--grace-seconds", "1", lease=1.0)
    wait_until(lambda: out.exists())
    peer = workers.start(lease=1.0)
    wait_until(lambda: begin_lines(out)["u0"] >= 2, timeout=30)  # the peer runs it again
    # ... only once the first process is gone (it was asleep in the unit for 30 s).
    assert hung.poll() == EXIT_UNIT_TIMEOUT, workers.log(hung)
    wait_until(lambda: Job.objects.get(pk=job.pk).state == "completed")
    peer.send_signal(signal.SIGTERM)
    assert peer.wait(timeout=10) == 0, workers.log(peer)
    job.refresh_from_db()
    assert (job.reclaims, job.attempts) == (1, 1)  # taken back as after a crash
    assert done_lines(out) == {"u0": 1}
    assert "did not stop after its unit_timeout" in workers.log(hung)
    # how each ended, for the Workers page: exit 70 (kept when the peer finds it gone), clean
    reasons = dict(WorkerProcess.objects.values_list("pid", "exit_reason"))
    assert reasons[hung.pid] == WorkerProcess.EXIT_UNIT_TIMEOUT
    assert reasons[peer.pid] == WorkerProcess.EXIT_CLEAN


def test_concurrent_workers__never_run_one_job_in_two_places(workers, tmp_path):
    paths = {}
    for n in range(12):
        path = tmp_path / f"job-{n}.log"
        job = jobs.enqueue("test.append", {"units": 6, "path": str(path), "sleep": 0.01})
        paths[job.pk] = path
    procs = [workers.start("--burst") for _ in range(4)]
    for proc in procs:
        assert proc.wait(timeout=120) == 0, workers.log(proc)
    assert set(Job.objects.values_list("state", flat=True)) == {"completed"}
    pids = set()
    for job_id, path in paths.items():
        rows = [line.split() for line in path.read_text().splitlines()]
        assert done_lines(path) == {f"u{i}": 1 for i in range(6)}
        # Within one job, every unit ends before the next one begins: never two at once.
        events = [(row[0], row[2], float(row[4])) for row in rows]
        assert [kind for kind, _, _ in events] == ["begin", "done"] * 6
        times = [t for _, _, t in events]
        assert times == sorted(times), f"overlapping units in job {job_id}"
        pids.update(row[3] for row in rows)
    assert len(pids) >= 2  # the four workers really shared the work


def test_sigterm__stops_at_a_unit_boundary_and_returns_the_job_unspent(workers, tmp_path):
    out = tmp_path / "side-effects.log"
    job = jobs.enqueue("test.append", {"units": 40, "path": str(out), "sleep": 0.05})
    proc = workers.start("--grace-seconds", "10")
    wait_until(lambda: Job.objects.get(pk=job.pk).units_done >= 2)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0, workers.log(proc)
    assert time.monotonic() - started < 3
    job.refresh_from_db()
    assert job.state == "queued"
    assert job.attempts == 0
    assert job.lease_owner is None
    assert 2 <= job.units_done < 40
    assert job.events.filter(kind="released").exists()
    assert workers.run(timeout=120).returncode == 0
    job.refresh_from_db()
    assert job.state == "completed"
    assert set(done_lines(out).values()) == {1}  # stopped between units: nothing repeated


def test_sigterm__a_unit_that_raises_stopping_is_handed_back_not_committed(workers, tmp_path):
    out = tmp_path / "side-effects.log"
    job = jobs.enqueue(
        "test.append", {"units": 2, "path": str(out), "sleep": 4, "cooperative": True}
    )
    proc = workers.start("--grace-seconds", "10")
    wait_until(lambda: out.exists())  # u0 is running
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0, workers.log(proc)
    assert time.monotonic() - started < 3  # it polled should_stop(), not slept out its 4 s
    job.refresh_from_db()
    # Nothing of the stopped unit was committed, and no attempt was spent.
    assert (job.state, job.checkpoint, job.units_done, job.attempts) == ("queued", None, 0, 0)
    assert job.events.filter(kind="released").exists()
    assert done_lines(out) == {}
    Job.objects.filter(pk=job.pk).update(input={"units": 2, "path": str(out), "sleep": 0})
    assert workers.run().returncode == 0
    job.refresh_from_db()
    assert job.state == "completed"
    assert begin_lines(out) == {"u0": 2, "u1": 1}  # the stopped unit ran again in full
    assert done_lines(out) == {"u0": 1, "u1": 1}


def test_sigterm__a_second_signal_exits_at_once(workers, tmp_path):
    job = jobs.enqueue("test.append", {"units": 2, "path": str(tmp_path / "x"), "sleep": 30})
    proc = workers.start("--grace-seconds", "60")
    wait_until(lambda: Job.objects.get(pk=job.pk).state == "running")
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert proc.poll() is None  # waiting for the unit, within its grace period
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=5) == 1


def test_sigterm__after_the_grace_period_the_lease_is_left_to_recovery(workers, tmp_path):
    out = tmp_path / "x"
    job = jobs.enqueue("test.append", {"units": 2, "path": str(out), "sleep": 3})
    proc = workers.start("--grace-seconds", "0.5", lease=30)
    wait_until(lambda: out.exists())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=5) == 0
    job.refresh_from_db()
    assert job.state == "running"  # the unit was still running: nobody may take it yet
    # Nor did it say "stopped" while that unit could still write: peers on this
    # machine see its PID gone, others wait for the lease.
    assert WorkerProcess.objects.get(pid=proc.pid).stopped_at is None
    # The process is gone, so a new worker on this machine takes the job back at
    # once instead of waiting out the 30 s lease.
    assert workers.run(timeout=60).returncode == 0
    job.refresh_from_db()
    assert job.state == "completed"
    assert job.reclaims == 1


@pytest.mark.parametrize(
    ("policy", "expected_state", "expected_runs"),
    [
        ("fail", "failed", {"u0": 1, "u1": 1, "u2": 1}),
        ("retry", "completed", {"u0": 2, "u1": 2, "u2": 2, "u3": 1}),
        ("resume", "completed", {"u0": 1, "u1": 1, "u2": 2, "u3": 1}),
    ],
)
def test_restart_policy__after_a_real_crash(
    workers, tmp_path, policy, expected_state, expected_runs
):
    out = tmp_path / "side-effects.log"
    job = jobs.enqueue("test.append", {"units": 4, "path": str(out)}, on_restart=policy)
    assert workers.run(faults="after_unit:3").returncode == -signal.SIGKILL
    assert workers.run().returncode == 0
    job.refresh_from_db()
    assert job.state == expected_state
    assert done_lines(out) == expected_runs
    if policy == "fail":
        assert job.error_code == "server_restarted"


def test_restart_during_backoff__the_wait_survives_the_restart(workers):
    job = jobs.enqueue("test.flaky", {"fail_times": 1, "error": "retry_later", "delay": 30})
    assert workers.run().returncode == 0
    job.refresh_from_db()
    waiting_until = job.next_attempt_at
    assert (job.state, job.attempts) == ("queued", 1)
    assert workers.run().returncode == 0  # a restarted worker finds nothing due
    job.refresh_from_db()
    assert (job.state, job.attempts, job.next_attempt_at) == ("queued", 1, waiting_until)


def _cancel_after(job_id: int, delay: float, outcome: dict) -> None:
    time.sleep(delay)
    outcome["cancel"] = jobs.cancel(job_id, actor="ops")
    connection.close()


def _work_on(job_id: int, owner: str) -> None:
    drain(job_id, owner=owner)
    connection.close()


def test_cancel_racing_completion__never_ends_both_ways():
    """Two threads, two connections: a worker finishing the last unit, an operator cancelling."""
    results: Counter = Counter()
    rng = random.Random(1)
    round_ = 0
    # The operator's delay adapts towards the moment the worker finishes (earlier
    # after a completion, later after a cancel), so on a fast or a loaded machine
    # the rounds cluster around the race and both orders are really exercised.
    window = 0.02
    while min(results["cancelled"], results["completed"]) < 3:
        round_ += 1
        assert round_ <= 200, f"the race never went both ways: {results}"
        job = jobs.enqueue("test.rows", {"units": 2, "sleep": 0.003})
        outcome: dict = {}
        threads = [
            threading.Thread(target=_cancel_after, args=(job.pk, rng.uniform(0, window), outcome)),
            threading.Thread(target=_work_on, args=(job.pk, f"race-{round_}")),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        job.refresh_from_db()
        kinds = set(job.events.values_list("kind", flat=True))
        cancel = outcome["cancel"]
        if cancel.applied:
            assert job.state == "cancelled", (
                "a cancel was accepted, yet the job did not end cancelled"
            )
            assert "completed" not in kinds
        else:
            assert job.state == "completed"
            assert cancel.refusal == "a completed job cannot be cancelled"
            assert "cancelled" not in kinds
        results[job.state] += 1
        window = window * 0.8 if job.state == "completed" else min(window * 1.25, 1.0)


def test_unique_key__eight_threads_enqueueing_at_once_create_one_job():
    barrier = threading.Barrier(8)
    ids: list[int] = []

    def submit() -> None:
        barrier.wait()
        ids.append(jobs.enqueue("test.rows", {}, unique_key="once").pk)
        connection.close()

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(ids) == 8
    assert len(set(ids)) == 1
    assert Job.objects.filter(unique_key="once").count() == 1


def test_worker__announces_its_start_and_heartbeats():
    from durable import signals
    from durable.worker import Worker

    seen: list[tuple[str, dict]] = []

    def started(sender, **kwargs):
        seen.append(("started", kwargs))

    def beat(sender, **kwargs):
        seen.append(("beat", kwargs))

    signals.worker_started.connect(started)
    signals.worker_heartbeat.connect(beat)
    try:
        jobs.enqueue("test.rows", {"units": 3, "sleep": 0.2})
        worker = Worker(worker_id="in-process", burst=True, lease_seconds=0.3, poll_interval=0.05)
        assert worker.run(install_signal_handlers=False) == 0
    finally:
        signals.worker_started.disconnect(started)
        signals.worker_heartbeat.disconnect(beat)
    assert seen[0] == (
        "started",
        {"signal": signals.worker_started, "worker_id": "in-process", "cold_start": True},
    )
    assert any(kind == "beat" and data["worker_id"] == "in-process" for kind, data in seen)


def test_worker__waits_for_an_unreachable_database_and_still_stops_cleanly(workers):
    proc = workers.start(env={"DATABASE_URL": "postgres://postgres@127.0.0.1:1/nowhere"})
    wait_until(lambda: "database unreachable" in workers.log(proc))
    time.sleep(2.5)  # two looks more at least: it looks every second
    log = workers.log(proc)
    assert log.count("database unreachable") == 1, log  # said once, not once per look
    assert "traceback=" not in log
    assert proc.poll() is None  # waiting, not crash-looping
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
