"""``python manage.py purge_jobs [--older-than 30d]``: retention for finished jobs."""

from __future__ import annotations

import argparse
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from durable.errors import InputRejected
from durable.jobs import enqueue
from durable.worker import Worker


class Command(BaseCommand):
    help = (
        "Delete finished (completed, failed, cancelled) jobs, their events and unit "
        "results, finished longer ago than --older-than, and API idempotency keys older "
        "than that. Unfinished jobs (and their keys) are never touched."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--older-than",
            default=None,
            help="e.g. 30d, 12h, 90m (default: DURABLE_RETENTION, the standing schedule's age)",
        )
        parser.add_argument(
            "--enqueue", action="store_true", help="only enqueue the purge for a worker to run"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        older_than = options["older_than"] or str(settings.DURABLE_RETENTION).strip()
        if older_than.lower() == "off":
            raise CommandError("DURABLE_RETENTION is off: say how old with --older-than (e.g. 30d)")
        try:
            job = enqueue("durable.purge", {"older_than": older_than}, owner="cli")
        except InputRejected as exc:
            raise CommandError(str(exc)) from None
        if options["enqueue"]:
            self.stdout.write(f"enqueued job {job.pk}")
            return
        job = Worker(burst=True).run_job(job.pk)
        results = [r.result for r in job.unit_results.all() if r.result]
        deleted = sum(r.get("jobs", 0) for r in results)
        keys = sum(r.get("idempotency_keys", 0) for r in results)
        if job.state != "completed":
            raise CommandError(f"purge job {job.pk} ended {job.state}: {job.reason}")
        self.stdout.write(
            f"purged {deleted} finished job(s) and {keys} idempotency key(s) (job {job.pk})"
        )
