"""What the built-in operations' management commands share: enqueue, wait, or run here.

``--wait`` shows the job's progress bar until it settles (a worker runs it);
``--inline`` runs it in the command's own process — for when the workers are
stopped, as during a restore or the final copy of a database move. Either
way the job is an ordinary durable job: Ctrl-C (or a crash) leaves it to
continue from its checkpoint.

Running a command again while its job is unfinished follows that job
instead of starting a second one: the operation's ``unique_key`` (one
restore per database, one move per pair of storages…) makes ``enqueue``
return it. If the unfinished job was started with a *different* input (a
restore of another backup into the same database), the command refuses and
names it rather than following a job that does something else.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ..errors import InputRejected, UnknownOperation
from ..jobs import clean_job_input, enqueue
from ..management.progress import follow, run_here
from ..models import Job, UnitResult
from ..operations import get_operation


def split_list(values: list[str] | None) -> list[str]:
    """``--exclude a --exclude b,c`` -> ["a", "b", "c"]."""
    return [item.strip() for value in values or [] for item in value.split(",") if item.strip()]


def enqueue_or_follow(
    operation: str, data: dict[str, Any], *, owner: str, out: Any, created_line: str = ""
) -> Job:
    """Enqueue, or return the unfinished job doing the same thing; refuse one doing another."""
    try:
        job = enqueue(operation, data, owner=owner)
    except (InputRejected, UnknownOperation) as exc:
        raise CommandError(str(exc)) from None
    if getattr(job, "created", True):
        line = created_line or "enqueued job {pk} ({operation})"
        out.write(line.format(pk=job.pk, operation=job.operation))
        return job
    try:
        wanted = clean_job_input(get_operation(operation), dict(data))
    except InputRejected:
        wanted = None  # e.g. a backup name now taken by the unfinished job's own publish
    if job.operation != operation or (wanted is not None and job.input != wanted):
        raise CommandError(
            f"job {job.pk} ({job.operation}, {job.state}) holds {job.unique_key!r} with another "
            f"input ({_short(job.input)}); wait for it or cancel it, then run this again"
        )
    out.write(f"job {job.pk} is already doing this ({job.state}); following it")
    return job


def _short(data: dict[str, Any], limit: int = 200) -> str:
    text = ", ".join(f"{key}={value!r}" for key, value in data.items())
    return text if len(text) <= limit else text[: limit - 1] + "…"


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

    def summary(self, job: Job) -> str:
        return f"job {job.pk} completed"

    def handle(self, *args: object, **options: Any) -> None:
        data = self.build_input(options)
        job = enqueue_or_follow(self.operation, data, owner=options["owner"], out=self.stdout)
        if options["inline"]:
            job = run_here(job.pk, self.stdout, interval=0.5)
        elif options["wait"]:
            job = follow(job.pk, self.stdout)
        else:
            return
        if job.state != "completed":
            raise CommandError(f"job {job.pk} ended {job.state}: {job.reason}")
        self.stdout.write(self.summary(job))


def unit_result(job: Job, key: str) -> dict[str, Any]:
    found = UnitResult.objects.filter(job=job, key=key).values_list("result", flat=True).first()
    return found or {}
