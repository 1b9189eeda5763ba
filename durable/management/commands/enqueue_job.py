"""``python manage.py enqueue_job OPERATION --input '{...}' [--wait]``."""

from __future__ import annotations

import argparse
import json
import sys
import time

from django.core.management.base import BaseCommand, CommandError

from durable.errors import InputRejected, UnknownOperation
from durable.jobs import enqueue
from durable.models import Job
from durable.states import OnRestart


class Command(BaseCommand):
    help = "Enqueue a durable job; with --wait, show its progress until it settles."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("operation")
        parser.add_argument("--input", default="{}", help="the job's input as a JSON object")
        parser.add_argument("--queue", default=None)
        parser.add_argument("--priority", type=int, default=None)
        parser.add_argument("--on-restart", choices=OnRestart.values, default=None)
        parser.add_argument("--owner", default="cli")
        parser.add_argument("--wait", action="store_true", help="wait until the job settles")

    def handle(self, *args: object, **options: object) -> None:
        try:
            data = json.loads(options["input"])
        except json.JSONDecodeError as exc:
            raise CommandError(f"--input is not JSON: {exc}") from None
        try:
            job = enqueue(
                options["operation"],
                data,
                owner=options["owner"],
                queue=options["queue"],
                priority=options["priority"],
                on_restart=options["on_restart"],
            )
        except (InputRejected, UnknownOperation) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"enqueued job {job.pk} ({job.operation})")
        if options["wait"]:
            job = wait_for(job.pk, self.stdout)
            if job.state != "completed":
                raise CommandError(f"job {job.pk} ended {job.state}: {job.reason}")


def progress_line(job: Job) -> str:
    if job.units_total:
        width = 30
        filled = int(width * min(job.units_done / job.units_total, 1))
        bar = "#" * filled + "-" * (width - filled)
        return f"[{bar}] {job.units_done}/{job.units_total} {job.state}"
    return f"{job.units_done} units {job.state}"


def wait_for(job_id: int, out: object, interval: float = 0.5) -> Job:
    """Poll until the job is finished or paused; a progress bar on a terminal."""
    tty = sys.stdout.isatty()
    last = ""
    while True:
        job = Job.objects.get(pk=job_id)
        line = progress_line(job)
        if line != last:
            if tty:
                sys.stdout.write("\r" + line)
                sys.stdout.flush()
            else:
                out.write(line)
            last = line
        if job.is_finished or job.state == "paused":
            if tty:
                sys.stdout.write("\n")
            return job
        time.sleep(interval)
