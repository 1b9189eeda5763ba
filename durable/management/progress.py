"""Run a job in the command's own process while showing its progress (``--wait``).

The job runs in a thread through ``Worker.run_job``, which claims it like any
worker would — so if a worker already has it, the command waits for that
worker instead of running it twice — while the main thread draws the
progress bar (``enqueue_job.wait_for``) until the job settles.
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.management.base import CommandError
from django.db import connection

from ..models import Job
from ..worker import Worker
from .commands.enqueue_job import wait_for


def run_here(job_id: int, out: Any, *, interval: float = 0.2) -> Job:
    failures: list[BaseException] = []

    def run() -> None:
        try:
            Worker(burst=True, poll_interval=interval).run_job(job_id)
        except BaseException as exc:  # reported below, in the main thread
            failures.append(exc)
        finally:
            connection.close()

    runner = threading.Thread(target=run, name=f"job-{job_id}", daemon=True)
    runner.start()
    job = wait_for(job_id, out, interval=interval)
    runner.join(timeout=30)
    if failures:
        raise CommandError(f"job {job_id} could not run here: {failures[0]}")
    return job
