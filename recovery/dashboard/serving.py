"""Which workers are alive, which queues they serve, and why a due job still waits.

Read by the Workers and Queues pages and by the Jobs pages ("no live worker
serves queue …"): below the views, so none of them imports another for it.
A worker is judged by its own lease (``durable.policy.worker_alive``), never by
a timeout of ours.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from durable.models import Job, WorkerProcess
from durable.policy import worker_alive
from durable.states import JobState

LIVE_HORIZON = timedelta(hours=1)  # rows read to find live workers (each judged by its lease)

STATUS_LABELS = {
    "live": "Live",
    "silent": "Lost (no heartbeat)",
    "clean": "Stopped cleanly",
    "lost": "Lost (killed or crashed)",
    "unit-timeout": "Exit 70 (a unit overran its timeout)",
    "stopped": "Stopped",
}


def worker_status(
    *,
    stopped_at: datetime | None,
    exit_reason: str,
    heartbeat_at: datetime,
    lease_seconds: float,
    now: datetime,
) -> str:
    """How a worker process is, or how it ended (a key of ``STATUS_LABELS``). Pure.

    Exit 70 is recorded by the worker itself before it leaves, and stays even when a
    peer later finds it gone; a worker that is silent beyond its own lease but not yet
    found gone is "silent" — lost for all practical purposes.
    """
    if exit_reason == WorkerProcess.EXIT_UNIT_TIMEOUT:
        return "unit-timeout"
    if stopped_at is not None:
        return exit_reason if exit_reason in STATUS_LABELS else "stopped"
    if worker_alive(heartbeat_at=heartbeat_at, lease_seconds=lease_seconds, now=now):
        return "live"
    return "silent"


def live_workers(now: datetime) -> list[WorkerProcess]:
    rows = WorkerProcess.objects.not_stopped(now, LIVE_HORIZON).exclude(
        exit_reason=WorkerProcess.EXIT_UNIT_TIMEOUT
    )
    return [
        w
        for w in rows
        if worker_alive(heartbeat_at=w.heartbeat_at, lease_seconds=w.lease_seconds, now=now)
    ]


def serving(now: datetime) -> dict[str, list[str]]:
    """Queue → ids of the live workers that claim from it."""
    served: dict[str, list[str]] = {}
    for worker in live_workers(now):
        for queue in worker.queues or []:
            served.setdefault(str(queue), []).append(worker.worker_id)
    return served


def why_waiting(job: Job, served: dict[str, list[str]], paused: set[str]) -> str:
    """For a due queued job: why no worker takes it ("" when one should). Pure."""
    if job.state != JobState.QUEUED:
        return ""
    if job.queue in paused:
        return f"queue {job.queue} is paused"
    if job.queue not in served:
        return f"no live worker serves queue {job.queue}"
    return ""
