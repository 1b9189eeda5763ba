"""``python manage.py move_files SOURCE DESTINATION [--prefix P | --name N ...] [--wait]``."""

from __future__ import annotations

import argparse

from django.core.management.base import BaseCommand, CommandError

from durable.builtin.cli import enqueue_or_follow
from durable.management.progress import run_here
from durable.models import Job, UnitResult


class Command(BaseCommand):
    help = (
        "Move files from one storage to another (aliases in STORAGES, or FILE_STORAGES "
        "name=/path) as the durable job files.move: each file is copied, its size and SHA-256 "
        "verified at the destination, and only then deleted at the source. Without --wait a "
        "worker runs it; with --wait it runs here with a progress bar (Ctrl-C stops it at the next "
        "file, to continue when run again). Run again while its job is unfinished, it follows "
        "that job."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("source", help="storage alias to move from")
        parser.add_argument("destination", help="storage alias to move to")
        parser.add_argument("--prefix", default="", help="only names starting with this")
        parser.add_argument("--name", action="append", default=[], help="exactly this file")
        parser.add_argument(
            "--on-conflict",
            choices=["fail", "skip"],
            default="fail",
            help="when the destination has a different file of that name (default: fail)",
        )
        parser.add_argument("--wait", action="store_true", help="run it here and report")

    def handle(self, *args: object, **options: object) -> None:
        data = {
            "source": options["source"],
            "destination": options["destination"],
            "prefix": options["prefix"],
            "names": options["name"],
            "on_conflict": options["on_conflict"],
        }
        route = f"{options['source']} → {options['destination']}"
        job = enqueue_or_follow(
            "files.move",
            data,
            owner="cli",
            out=self.stdout,
            created_line="enqueued job {pk}: move " + route.replace("{", "{{").replace("}", "}}"),
        )
        if not options["wait"]:
            return
        job = run_here(job.pk, self.stdout)
        self.stdout.write(summary_line(job))
        if job.state != "completed":
            raise CommandError(f"job {job.pk} ended {job.state}: {job.reason}")


def summary_line(job: Job) -> str:
    """From the job's last unit, which counted every file's outcome."""
    result = (
        UnitResult.objects.filter(job_id=job.pk, key="summary")
        .values_list("result", flat=True)
        .first()
    ) or {}
    outcomes = result.get("summary") or {}
    moved = outcomes.get("moved", 0) + outcomes.get("already_moved", 0)
    line = f"moved {moved:,} file(s), {result.get('bytes', 0):,} bytes"
    if outcomes.get("conflict_skipped"):
        line += f"; skipped {outcomes['conflict_skipped']:,} (a different file at the destination)"
    if outcomes.get("vanished"):
        line += f"; {outcomes['vanished']:,} vanished"
    return line
