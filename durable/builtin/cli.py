"""What the built-in operations' management commands share: enqueue, wait, or run here.

``--wait`` shows the job's progress bar until it settles (a worker runs it);
``--inline`` runs it in the command's own process — for when the workers are
stopped, as during a restore or the final copy of a database move. Either
way the job is an ordinary durable job: Ctrl-C (or a crash) leaves it to
continue from its checkpoint.
"""

from __future__ import annotations

import argparse
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from ..errors import InputRejected, UnknownOperation
from ..jobs import enqueue
from ..management.commands.enqueue_job import wait_for
from ..models import Job, UnitResult
from ..worker import Worker


def split_list(values: list[str] | None) -> list[str]:
    """``--exclude a --exclude b,c`` -> ["a", "b", "c"]."""
    return [item.strip() for value in values or [] for item in value.split(",") if item.strip()]


class OperationCommand(BaseCommand):
    """Subclasses set ``operation`` and implement ``add_input_arguments`` and ``build_input``."""

    operation = ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        self.add_input_arguments(parser)
        how = parser.add_mutually_exclusive_group()
        how.add_argument(
            "--wait", action="store_true", help="show the progress until a worker settles the job"
        )
        how.add_argument(
            "--inline",
            action="store_true",
            help="run the job in this process (no worker needed) with a progress bar",
        )
        parser.add_argument("--owner", default="cli")

    def add_input_arguments(self, parser: argparse.ArgumentParser) -> None:
        raise NotImplementedError

    def build_input(self, options: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def unique_key(self, data: dict[str, Any]) -> str | None:
        return None

    def summary(self, job: Job) -> str:
        return f"job {job.pk} completed"

    def handle(self, *args: object, **options: Any) -> None:
        data = self.build_input(options)
        try:
            job = enqueue(
                self.operation, data, owner=options["owner"], unique_key=self.unique_key(data)
            )
        except (InputRejected, UnknownOperation) as exc:
            raise CommandError(str(exc)) from None
        if getattr(job, "created", True):
            self.stdout.write(f"enqueued job {job.pk} ({job.operation})")
        else:
            self.stdout.write(f"job {job.pk} is already doing this ({job.state}); following it")
        if options["inline"]:
            job = self._run_here(job.pk)
        elif options["wait"]:
            job = wait_for(job.pk, self.stdout)
        else:
            return
        if job.state != "completed":
            raise CommandError(f"job {job.pk} ended {job.state}: {job.reason}")
        self.stdout.write(self.summary(job))

    def _run_here(self, job_id: int) -> Job:
        worker = Worker(burst=True, poll_interval=0.5)
        failure: list[BaseException] = []

        def run() -> None:
            try:
                worker.run_job(job_id)
            except BaseException as exc:  # reported by the main thread
                failure.append(exc)
            finally:
                connections.close_all()

        thread = threading.Thread(target=run, name="durable-inline")
        thread.start()
        try:
            job = wait_for(job_id, self.stdout)
        except KeyboardInterrupt:
            worker.stop()
            self.stdout.write("interrupted: stopping at the next unit boundary")
            self.stdout.flush()
            thread.join()
            raise CommandError(
                f"interrupted: job {job_id} stops at its next unit boundary and continues "
                "from its checkpoint when run again"
            ) from None
        thread.join()
        if failure:
            raise CommandError(f"job {job_id}: {failure[0]}")
        return job


def unit_result(job: Job, key: str) -> dict[str, Any]:
    found = UnitResult.objects.filter(job=job, key=key).values_list("result", flat=True).first()
    return found or {}
