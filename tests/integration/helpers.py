"""Run jobs in the test's own thread and connection, so ordinary transactional tests work."""

from __future__ import annotations

import time

from durable.lease import claim
from durable.models import Job
from durable.operations import registered
from durable.worker import Worker


def drain(
    job_id: int | None = None, *, owner: str = "test-worker", timeout: float = 10.0
) -> Job | None:
    """Claim and run due jobs until ``job_id`` settles (finished or paused) or nothing is due."""
    worker = Worker(worker_id=owner, burst=True, lease_seconds=30)
    ops = sorted(registered())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        claimed = claim(owner, queues=["default"], operations=ops, lease_seconds=30, job_id=job_id)
        if claimed is not None:
            worker.execute(*claimed)
            continue
        if job_id is None:
            return None
        job = Job.objects.get(pk=job_id)
        if job.is_finished or job.state == "paused":
            return job
        time.sleep(0.01)  # waiting out a short backoff
    raise AssertionError(f"job {job_id} did not settle within {timeout}s")
