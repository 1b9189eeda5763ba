"""``python manage.py ingest_recovery_events [PATH] [--wait]``."""

from __future__ import annotations

import argparse
import os
import threading

from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from durable.errors import InputRejected
from durable.management.commands.enqueue_job import wait_for
from durable.models import Job
from durable.worker import Worker
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
        if job.created:
            self.stdout.write(f"enqueued job {job.pk}: import {path}")
        else:
            self.stdout.write(f"an import of {path} is already {job.state} as job {job.pk}")
        if not options["wait"]:
            return
        job = self._run_here(job.pk)
        if job.state != "completed":
            raise CommandError(f"job {job.pk} ended {job.state}: {job.reason}")
        self.stdout.write(summary_line(job))

    def _run_here(self, job_id: int) -> Job:
        """Run the job in a thread (or wait for its worker) while showing its progress."""
        failures: list[BaseException] = []

        def run() -> None:
            try:
                Worker(burst=True, poll_interval=0.2).run_job(job_id)
            except BaseException as exc:  # reported below, in the main thread
                failures.append(exc)
            finally:
                connection.close()

        runner = threading.Thread(target=run, name="ingest", daemon=True)
        runner.start()
        job = wait_for(job_id, self.stdout, interval=0.2)
        runner.join(timeout=30)
        if failures:
            raise CommandError(f"job {job_id} could not run here: {failures[0]}")
        return job


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
