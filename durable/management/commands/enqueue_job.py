"""``python manage.py enqueue_job OPERATION --input '{...}' [--wait]``.

``--inputs FILE`` (JSON Lines, ``-`` for standard input) enqueues one job per
line with ``enqueue_many``: every line is checked first, then all jobs are
written in one transaction, so a bad line 9,000 leaves nothing half-queued.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, OutputWrapper

from durable.errors import InputRejected, UnknownOperation
from durable.jobs import enqueue, enqueue_many
from durable.models import Job
from durable.states import OnRestart


class Command(BaseCommand):
    help = "Enqueue a durable job; with --wait, show its progress until it settles."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("operation")
        parser.add_argument("--input", default="{}", help="the job's input as a JSON object")
        parser.add_argument(
            "--inputs",
            metavar="FILE",
            default=None,
            help="one job per line of this JSON Lines file ('-': standard input), "
            "all validated first, then enqueued in one transaction",
        )
        parser.add_argument("--queue", default=None)
        parser.add_argument("--priority", type=int, default=None)
        parser.add_argument("--on-restart", choices=OnRestart.values, default=None)
        parser.add_argument("--owner", default="cli")
        parser.add_argument("--wait", action="store_true", help="wait until the job settles")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["inputs"] is not None:
            if options["wait"]:
                raise CommandError("--wait follows one job; it cannot be used with --inputs")
            self._enqueue_many(options)
            return
        try:
            data = json.loads(options["input"])
        except json.JSONDecodeError as exc:
            raise CommandError(f"--input is not JSON: {exc}") from None
        job = _refusing(enqueue, options, data)
        self.stdout.write(f"enqueued job {job.pk} ({job.operation})")
        if options["wait"]:
            job = wait_for(job.pk, self.stdout)
            if job.state != "completed":
                raise CommandError(f"job {job.pk} ended {job.state}: {job.reason}")

    def _enqueue_many(self, options: dict[str, Any]) -> None:
        jobs = _refusing(enqueue_many, options, read_json_lines(options["inputs"]))
        created = [job.pk for job in jobs if job.created]
        existing = len(jobs) - len(created)
        span = f" (ids {min(created)}-{max(created)})" if created else ""
        self.stdout.write(
            f"enqueued {len(created)} {options['operation']} job(s){span}"
            + (f"; {existing} input(s) matched an unfinished job's unique key" if existing else "")
        )


def read_json_lines(path: str) -> list[dict]:
    """Each non-blank line one JSON object; the first bad line is a clear error."""
    try:
        handle = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise CommandError(f"--inputs: {exc}") from None
    inputs = []
    with handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CommandError(f"--inputs line {number} is not JSON: {exc}") from None
            if not isinstance(value, dict):
                raise CommandError(f"--inputs line {number}: each line must be a JSON object")
            inputs.append(value)
    if not inputs:
        raise CommandError("--inputs: no job to enqueue (the file has no line)")
    return inputs


def progress_line(job: Job) -> str:
    if job.units_total:
        width = 30
        filled = int(width * min(job.units_done / job.units_total, 1))
        bar = "#" * filled + "-" * (width - filled)
        return f"[{bar}] {job.units_done}/{job.units_total} {job.state}"
    return f"{job.units_done} units {job.state}"


def wait_for(job_id: int, out: OutputWrapper, interval: float = 0.5) -> Job:
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


def _refusing(enqueuer: Callable[..., Any], options: dict[str, Any], data: Any) -> Any:
    """``enqueue`` or ``enqueue_many`` with the command's options; a refusal is a CommandError."""
    try:
        return enqueuer(
            options["operation"],
            data,
            owner=options["owner"],
            queue=options["queue"],
            priority=options["priority"],
            on_restart=options["on_restart"],
        )
    except (InputRejected, UnknownOperation) as exc:
        raise CommandError(str(exc)) from None
