"""``python manage.py import_recovery_events FILE [--format jsonl|csv] [--wait]``."""

from __future__ import annotations

import argparse
import os

from django.core.management.base import BaseCommand, CommandError

from durable.builtin.cli import enqueue_or_follow
from durable.management.progress import run_here
from durable.models import Job, UnitResult


def guess_format(path: str) -> str:
    return "csv" if path.lower().endswith(".csv") else "jsonl"


class Command(BaseCommand):
    help = (
        "Import recovery events from another instance's export (JSONL, or CSV with a header "
        "row) as the durable job import.jsonl / import.csv. The same file (by SHA-256) is "
        "imported once; bad lines or rows are skipped and counted. Without --wait a worker "
        "runs it; with --wait it runs here with a progress bar and prints what it did."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("file", help="the export file, as the workers see it")
        parser.add_argument(
            "--format", choices=["jsonl", "csv"], default=None, help="default: by the extension"
        )
        parser.add_argument("--batch", type=int, default=None, help="records per unit (1000)")
        parser.add_argument("--wait", action="store_true", help="run it here and report")

    def handle(self, *args: object, **options: object) -> None:
        path = os.path.abspath(os.path.expanduser(str(options["file"])))
        if not os.path.isfile(path):
            raise CommandError(f"{path} does not exist or is not a regular file.")
        fmt = options["format"] or guess_format(path)
        data: dict[str, object] = {"path": path}
        if options["batch"] is not None:
            data["batch_records"] = options["batch"]
        job = enqueue_or_follow(
            f"import.{fmt}", data, owner="cli", out=self.stdout,
            created_line=f"enqueued job {{pk}}: import {path} ({fmt})",
        )  # fmt: skip
        if not options["wait"]:
            return
        job = run_here(job.pk, self.stdout)
        if job.state != "completed":
            raise CommandError(f"job {job.pk} ended {job.state}: {job.reason}")
        self.stdout.write(outcome_line(job))


def outcome_line(job: Job) -> str:
    """What the job's events say it did: imported, or recognised the file as imported before."""
    event = (
        job.events.filter(kind__in=["imported", "already_imported", "being_imported"])
        .order_by("-seq")
        .first()
    )
    if event is None:  # pragma: no cover - a completed import always logs one of them
        results = UnitResult.objects.filter(job_id=job.pk).count()
        return f"completed ({results} units)"
    return event.message
