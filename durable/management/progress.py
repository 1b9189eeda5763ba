"""Run a job in the command's own process while showing its progress.

The job runs in a thread through ``Worker.run_job``, which claims it like any
worker would — so if a worker already has it, the command waits for that
worker instead of running it twice — while the main thread draws the
progress bar (``enqueue_job.wait_for``) until the job settles.

Ctrl-C is a clean stop, as SIGTERM is for ``runworker``: the unit in flight
finishes, the job is released at its checkpoint (queued, no attempt spent)
and the command says how to continue. A second Ctrl-C leaves at once; the
job's lease then expires and any worker (or the command, run again) takes
it back from its checkpoint.
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.management.base import CommandError
from django.db import connections

from ..models import Job
from ..worker import Worker
from .commands.enqueue_job import wait_for

INTERRUPTED = "interrupted: stopping at the next unit boundary (Ctrl-C again to leave at once)"


def run_here(job_id: int, out: Any, *, interval: float = 0.2) -> Job:
    """Run (or follow) job ``job_id`` here until it settles; CommandError on Ctrl-C."""
    worker = Worker(burst=True, poll_interval=interval)
    failures: list[BaseException] = []

    def run() -> None:
        try:
            worker.run_job(job_id)
        except BaseException as exc:  # reported below, in the main thread
            failures.append(exc)
        finally:
            connections.close_all()  # every alias the job used (a copy's target, a restore's)

    runner = threading.Thread(target=run, name=f"job-{job_id}", daemon=True)
    runner.start()
    try:
        job = wait_for(job_id, out, interval=interval)
    except KeyboardInterrupt:
        worker.stop()  # the runner releases the job at its next unit boundary
        out.write(INTERRUPTED)
        out.flush()
        try:
            runner.join()
        except KeyboardInterrupt:
            raise CommandError(
                f"interrupted again: job {job_id} is left to its lease; once that expires a "
                "worker, or this command run again, continues it from its checkpoint"
            ) from None
        raise CommandError(
            f"interrupted: job {job_id} stops at its next unit boundary and continues "
            "from its checkpoint when run again (no attempt was spent)"
        ) from None
    runner.join(timeout=30)
    if failures:
        raise CommandError(f"job {job_id} could not run here: {failures[0]}")
    return job


def follow(job_id: int, out: Any, *, interval: float = 0.5) -> Job:
    """Show the progress of a job a worker runs; Ctrl-C stops watching, not the job."""
    try:
        return wait_for(job_id, out, interval=interval)
    except KeyboardInterrupt:
        raise CommandError(
            f"stopped following job {job_id}; it carries on in the workers"
        ) from None
