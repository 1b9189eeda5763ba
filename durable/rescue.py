"""Restart recovery: take jobs back from workers that stopped, per their on_restart policy.

Runs when a worker starts (before it claims anything) and periodically while
it runs (on the worker's housekeeping thread, never the one renewing its own
leases), in every worker process, so there is no single rescuer that can
itself stall; it skips rows another transaction has locked instead of
waiting. Each reclaim is one conditional transaction on the job's observed
lease epoch: two rescuers racing over the same job apply the policy once.

A lease is reclaimable when it expired, or — without waiting — when its
owner ran in this same process space (same boot, same PID namespace) and
that process no longer exists. A stopped-but-alive process (SIGSTOP) keeps
its job until the lease expires; fencing then makes its late writes no-ops.
On SQLite an expired lease is still not reclaimable while its owner's process
runs on this machine and pulses (see "liveness judged by the holder's
process" below): there, a renewal may wait for the write lock past its lease.

A worker lost after its lease committed units spends no attempt
(``states.worker_lost_spends_attempt``); its death is recorded all the same.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache
from pathlib import Path

from django.db import connection, transaction
from django.db.models import Max, Q
from django.utils import timezone

from . import signals, turns
from .endings import Write, reclaimed
from .jobs import add_events, announce_change, needs_attention
from .models import Job, UnitResult, WorkerProcess, database_now, db_now
from .operations import get_operation, registered
from .policy import reclaim_delay, worker_alive
from .sql import statements
from .states import LEASED_STATES, JobState, OnRestart
from .transitions import attend, write

log = logging.getLogger("durable.rescue")

RECLAIM_BATCH = 200
# Rows heard from longer ago than this are not read when judging liveness
# (twice the longest lease runworker accepts).
LIVENESS_HORIZON = timedelta(days=2)


@cache
def host_key() -> str:
    """Identifies the PID space this process lives in: the boot plus the PID namespace."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            boot = handle.read().strip()
        pidns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""  # not Linux: fall back to lease expiry only
    return f"{boot}:{pidns}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as handle:
            # A zombie has exited; only its parent has not collected it yet.
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


@dataclass
class StartupReport:
    cold_start: bool
    boundary: datetime | None
    failed_queued: list[int] = field(default_factory=list)
    reclaimed: list[int] = field(default_factory=list)


def _gone_here(worker: WorkerProcess) -> bool:
    """The worker ran in this PID space and its process no longer exists."""
    mine = host_key()
    return bool(mine) and worker.host_key == mine and not pid_alive(worker.pid)


def any_worker_alive(now: datetime, *, besides: str = "") -> bool:
    """Is some registered worker (other than ``besides``) still running? Each is judged by
    its own lease — or, on SQLite, by its pulse: its heartbeat may be waiting for the
    write lock."""
    candidates = WorkerProcess.objects.not_stopped(now, LIVENESS_HORIZON).exclude(worker_id=besides)
    return any(
        (
            worker_alive(heartbeat_at=w.heartbeat_at, lease_seconds=w.lease_seconds, now=now)
            or _pulsing_here(w)
        )
        and not _gone_here(w)
        for w in candidates
    )


def register_worker(
    worker_id: str, *, queues: list[str], concurrency: int, lease_seconds: float
) -> tuple[bool, datetime | None]:
    """Record this worker; report whether it is a cold start (no other live worker).

    Serialised so that of several workers starting together exactly one sees a
    cold start. ``boundary`` is when the previous fleet was last seen alive: jobs
    queued before it were left over by that fleet. Heartbeats and "now" are on
    the database clock on PostgreSQL, so workers on machines with skewed clocks
    still agree on who is alive.
    """
    with transaction.atomic():
        statements(connection).serialize_registration(connection)
        now = database_now()
        # Not itself: a try whose commit went through but whose answer an outage
        # swallowed left this worker's row, and the retry must judge as the first did.
        alive = any_worker_alive(now, besides=worker_id)
        boundary = None
        if not alive:
            others = WorkerProcess.objects.exclude(worker_id=worker_id)
            boundary = others.aggregate(last=Max("heartbeat_at"))["last"]
        _register(worker_id, now, queues=queues, concurrency=concurrency, lease=lease_seconds)
    return not alive, boundary


def _register(
    worker_id: str, now: datetime, *, queues: list[str], concurrency: int, lease: float
) -> None:
    # update_or_create: registering again (a retried start-up, see above) is not an error.
    WorkerProcess.objects.update_or_create(
        worker_id=worker_id,
        defaults={
            "hostname": socket.gethostname()[:255],
            "pid": os.getpid(),
            "host_key": host_key(),
            "queues": queues,
            "concurrency": concurrency,
            "lease_seconds": lease,
            "started_at": now,
            "heartbeat_at": now,
        },
    )


def register_inline(worker_id: str, *, lease_seconds: float) -> None:
    """A process running one job by hand: known for fast reclaim, no startup recovery."""
    _register(worker_id, database_now(), queues=[], concurrency=1, lease=lease_seconds)


def heartbeat(worker_id: str) -> None:
    WorkerProcess.objects.filter(worker_id=worker_id).update(heartbeat_at=db_now())


def mark_stopped(worker_id: str) -> None:
    """The worker drained and leaves cleanly."""
    WorkerProcess.objects.filter(worker_id=worker_id).update(
        stopped_at=db_now(), exit_reason=WorkerProcess.EXIT_CLEAN
    )


def record_exit_reason(worker_id: str, reason: str) -> None:
    """How a worker is about to leave when it cannot mark itself stopped (exit 70).

    Not ``stopped_at``: peers must still take its jobs back as after a crash.
    """
    WorkerProcess.objects.filter(worker_id=worker_id).update(exit_reason=reason)


def _mark_lost(worker: WorkerProcess) -> None:
    """Found gone by a peer; an exit reason it recorded itself (exit 70) is kept."""
    WorkerProcess.objects.filter(pk=worker.pk).update(stopped_at=db_now())
    WorkerProcess.objects.filter(pk=worker.pk, exit_reason="").update(
        exit_reason=WorkerProcess.EXIT_LOST
    )


# --- SQLite: liveness judged by the holder's process --------------------------------
#
# On SQLite every worker shares one machine, and a lease renewal needs the one
# write lock, which another process may hold for longer than a lease (an atomic
# unit). So a lease held by a process of this machine is judged by that process
# instead: while it exists and its pulse — a file it touches every third of its
# lease from a thread that never touches the database, so no lock can delay it —
# is fresh, its jobs are not taken back, however late its renewals are. A
# stopped (SIGSTOP) process is judged by its lease again, a frozen one once its
# pulse is a lease old; one whose PID is gone is taken back at once. Fencing
# is unchanged.


def pulse_path(worker_id: str) -> Path | None:
    """The pulse file of ``worker_id`` beside the SQLite database; None on PostgreSQL."""
    database = turns.sqlite_file(connection)
    if database is None:
        return None
    return Path(f"{database}-pulse") / hashlib.sha256(worker_id.encode()).hexdigest()[:32]


def pulse(worker_id: str) -> None:
    """The worker is alive and running (its pulse thread, every third of its lease)."""
    path = pulse_path(worker_id)
    if path is None:
        return
    try:
        os.utime(path)
    except FileNotFoundError:
        try:
            path.parent.mkdir(exist_ok=True)
            path.touch()
        except OSError:
            pass  # a read-only directory: judged by its lease, as before
    except OSError:
        pass


def stop_pulse(worker_id: str) -> None:
    path = pulse_path(worker_id)
    if path is not None:
        path.unlink(missing_ok=True)


def prune_pulses(older_than: timedelta = LIVENESS_HORIZON) -> int:
    """Remove pulse files left by workers that died (SIGKILL leaves its file); at start-up.

    Returns how many went.
    """
    probe = pulse_path("")
    if probe is None or not probe.parent.is_dir():
        return 0
    cutoff = time.time() - older_than.total_seconds()
    removed = 0
    for path in probe.parent.iterdir():
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
                removed += 1
        except OSError:
            continue  # removed by another worker meanwhile
    return removed


def process_stopped(pid: int) -> bool:
    """Stopped by a signal (SIGSTOP, a debugger): alive, but renewing nothing."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def _pulsing_here(worker: WorkerProcess) -> bool:
    """The worker runs in this PID space, its process exists and is not stopped, and it
    pulsed within its lease."""
    mine = host_key()
    path = pulse_path(worker.worker_id)
    if not (path is not None and mine and worker.host_key == mine and pid_alive(worker.pid)):
        return False
    if process_stopped(worker.pid):
        return False  # judged by its lease, as a stopped process always was
    try:
        age = time.time() - path.stat().st_mtime
    except OSError:
        return False
    return age <= max(worker.lease_seconds, 0.0)


def _judge_owners(me: str) -> tuple[list[str], list[str]]:
    """Lease owners known to be gone, and (SQLite) those alive here whatever their leases say.

    Gone: they said goodbye, or their PID no longer exists here. ``stopped_at``
    is only ever set for a process that is certainly gone (by itself on exit,
    or here after checking its PID), so such leases can be taken back before
    they expire without risking two live workers on a job.
    """
    owners = set(
        Job.objects.filter(state__in=LEASED_STATES, lease_owner__isnull=False)
        .exclude(lease_owner=me)
        .values_list("lease_owner", flat=True)
        .distinct()
    )
    if not owners:
        return [], []
    dead, alive = [], []
    for worker in WorkerProcess.objects.filter(worker_id__in=owners):
        if worker.stopped_at is not None:
            dead.append(worker.worker_id)
        elif _gone_here(worker):
            _mark_lost(worker)
            dead.append(worker.worker_id)
        elif _pulsing_here(worker):
            alive.append(worker.worker_id)
    return dead, alive


def _reclaimable(me: str) -> Q:
    condition = Q(lease_expires_at__lt=db_now())
    dead, alive = _judge_owners(me)
    if alive:
        condition &= ~Q(lease_owner__in=alive)
    if dead:
        condition |= Q(lease_owner__in=dead)
    return Q(state__in=LEASED_STATES, lease_owner__isnull=False) & condition & ~Q(lease_owner=me)


def reclaim(me: str, *, limit: int = RECLAIM_BATCH) -> list[int]:
    """Apply the restart policy to every job held by a stopped worker; return their ids."""
    condition = _reclaimable(me)
    candidates = list(
        Job.objects.filter(condition)
        .order_by("lease_expires_at")
        .values_list("pk", "lease_epoch")[:limit]
    )
    done: list[int] = []
    for job_id, epoch in candidates:
        if _reclaim_one(job_id, epoch, condition, me, position=len(done)):
            done.append(job_id)
    return done


def _reclaim_one(job_id: int, epoch: int, condition: Q, me: str, *, position: int = 0) -> bool:
    """Apply the restart policy to one job, decided by ``endings.reclaimed``: one
    transaction on the job's observed lease epoch, so two rescuers racing over the same
    job apply it once. False when the job was no longer there to take back."""
    now = timezone.now()
    with transaction.atomic():
        # SKIP LOCKED: a locked row is being changed right now — typically its
        # holder's atomic unit, alive (its commit renews the lease) or stalled
        # (PostgreSQL ends that session after PG_IDLE_IN_TRANSACTION_TIMEOUT).
        # Either way waiting here would only stall this rescuer; the next round
        # looks again.
        job = (
            Job.objects.select_for_update(skip_locked=True)
            .filter(condition, pk=job_id, lease_epoch=epoch)
            .first()
        )
        if job is None:
            return False  # locked, renewed, finished or reclaimed by a peer meanwhile
        old, previous, checkpoint = job.state, job.lease_owner, job.checkpoint
        decided = reclaimed(
            job,
            now,
            epoch=epoch,
            by=me,
            on_exhausted=_on_exhausted(job.operation),
            delay=reclaim_delay(position),
        )
        if decided.drop_results:
            UnitResult.objects.filter(job_id=job.pk).delete()
        write(job, decided.ending, now)
        if isinstance(decided.ending, Write):
            signals.send_on_commit(
                signals.job_reclaimed,
                job_id=job.pk,
                operation=job.operation,
                previous_owner=previous,
                policy=job.on_restart,
                outcome=decided.outcome.value,
                old_state=old,
                new_state=job.state,
                # Where the job was when its worker stopped (on_restart=retry has
                # just dropped it, so job.checkpoint would say None).
                checkpoint=checkpoint,
                attempt=job.attempts,
                next_attempt_at=job.next_attempt_at if job.state == JobState.QUEUED else None,
                reason=job.reason,
                # False: the lost lease had committed units, so the death is on record
                # but spent no attempt (None for a cancel finished on the worker's behalf).
                attempt_spent=decided.facts.get("attempt_spent"),
                units_committed=decided.facts.get("units_committed"),
            )
            attend(job, decided.ending)
    return True


def _on_exhausted(operation: str) -> str:
    """What an operation's jobs become once out of attempts; failed if it is gone."""
    return get_operation(operation).on_exhausted if operation in registered() else JobState.FAILED


def fail_leftover_queued(boundary: datetime, me: str) -> list[int]:
    """Cold start: queued jobs with on_restart=fail that the previous fleet left behind."""
    failed = []
    ids = list(
        Job.objects.filter(
            state=JobState.QUEUED, on_restart=OnRestart.FAIL, created_at__lte=boundary
        ).values_list("pk", flat=True)
    )
    for job_id in ids:
        now = timezone.now()
        with transaction.atomic():
            job = (
                Job.objects.select_for_update()
                .filter(pk=job_id, state=JobState.QUEUED, on_restart=OnRestart.FAIL)
                .first()
            )
            if job is None:
                continue
            reason = "the server restarted before it ran and its on_restart policy is 'fail'"
            job.state, job.finished_at, job.updated_at = JobState.FAILED, now, now
            job.error_code, job.reason = "server_restarted", reason
            add_events(job, [("failed", reason, {"policy": "fail", "by": me})], now)
            job.save(
                update_fields=[
                    "state",
                    "finished_at",
                    "updated_at",
                    "error_code",
                    "reason",
                    "event_seq",
                ]
            )
            announce_change(job, JobState.QUEUED, "failed", reason, {})
            needs_attention(job, "server_restarted", reason)
            failed.append(job_id)
    return failed


def recover_at_startup(
    worker_id: str,
    *,
    queues: list[str],
    concurrency: int,
    lease_seconds: float,
    reclaim_now: bool = True,
) -> StartupReport:
    """Register, fail what a cold start must, and (``reclaim_now``) take back the jobs of
    stopped workers. Not right after a database outage: every lease may have expired
    meanwhile, their workers alive and renewing them as this starts (housekeeping takes
    back those of dead workers a few seconds later)."""
    cold, boundary = register_worker(
        worker_id, queues=queues, concurrency=concurrency, lease_seconds=lease_seconds
    )
    report = StartupReport(cold_start=cold, boundary=boundary)
    prune_pulses()
    if cold and boundary is not None:
        report.failed_queued = fail_leftover_queued(boundary, worker_id)
    while reclaim_now and (batch := reclaim(worker_id)):
        report.reclaimed.extend(batch)
    return report
