"""``python manage.py ingest_recovery_events [PATH] [--wait]``."""

from __future__ import annotations

import argparse
import os

from django.core.management.base import BaseCommand, CommandError

from durable.errors import InputRejected
from durable.management.progress import run_here
from durable.models import Job
from recovery.operations import job_summary
from recovery.policy import WEKAN_DIR_VARIABLES
from recovery.receivers import configured_events_file, enqueue_ingest
from recovery.tailer import canonical

NOT_CONFIGURED = (
    "No recovery-events file to import: pass its PATH, or set RECOVERY_EVENTS_FILE "
    f"(or one of {', '.join(WEKAN_DIR_VARIABLES)} to the directory holding "
    "recovery-events.jsonl)."
)


class Command(BaseCommand):
    help = (
        "Import the lines of recovery-events.jsonl added since the last import, as the "
        "durable job recovery.ingest. Without --wait a worker runs it; with --wait it runs "
        "here (or waits for the worker already running it) and prints what it imported."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "path", nargs="?", default=None, help="the file (default: from the settings)"
        )
        parser.add_argument("--wait", action="store_true", help="run it now and report")

    def handle(self, *args: object, **options: object) -> None:
        path = options["path"] or configured_events_file()
        if not path:
            raise CommandError(NOT_CONFIGURED)
        path = canonical(str(path))  # as the job and the schedule spell it
        if not os.path.exists(path):
            raise CommandError(f"{path} does not exist: there is nothing to import yet.")
        if not os.path.isfile(path):
            raise CommandError(f"{path} is not a regular file.")
        try:
            job = enqueue_ingest(path, owner="cli")
        except InputRejected as exc:
            raise CommandError(str(exc)) from None
        if getattr(job, "created", True):  # set by enqueue(), not a column
            self.stdout.write(f"enqueued job {job.pk}: import {path}")
        else:
            self.stdout.write(f"an import of {path} is already {job.state} as job {job.pk}")
        if not options["wait"]:
            return
        job = run_here(job.pk, self.stdout)
        if job.state != "completed":
            raise CommandError(f"job {job.pk} ended {job.state}: {job.reason}")
        self.stdout.write(summary_line(job))


def summary_line(job: Job) -> str:
    summary = job_summary(job.pk)
    skipped = summary.get("skipped") or {}
    line = f"imported {summary.get('imported', 0):,} of {summary.get('lines', 0):,} new lines"
    if skipped:
        reasons = ", ".join(f"{n:,} {reason}" for reason, n in sorted(skipped.items()))
        line += f"; skipped {reasons}"
    for note in summary.get("notes") or []:
        line += f"; {note}"
    return line
