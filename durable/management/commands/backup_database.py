"""``python manage.py backup_database [--name NAME] [--wait | --inline]``."""

from __future__ import annotations

import argparse
from typing import Any

from durable.builtin.cli import OperationCommand, split_list, unit_result
from durable.models import Job


class Command(OperationCommand):
    help = (
        "Back up this site's tables (not the job tables) into DURABLE_BACKUP_DIR/NAME: one "
        "checksummed file per batch, the manifest and SHA256SUMS published last."
    )
    operation = "backup.database"

    def add_input_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--database", default="default", help="database alias (default)")
        parser.add_argument("--name", default="", help="default: backup-<UTC time>-<random>")
        parser.add_argument("--batch-size", type=int, default=None, help="rows per part file")
        parser.add_argument(
            "--exclude", action="append", help="app or app.model to leave out (repeatable)"
        )
        parser.add_argument(
            "--snapshot",
            action="store_true",
            help="SQLite: back up a consistent copy taken at the start (VACUUM INTO)",
        )

    def build_input(self, options: dict[str, Any]) -> dict[str, Any]:
        data = {
            "database": options["database"],
            "exclude": split_list(options["exclude"]),
            "snapshot": options["snapshot"],
        }
        if options["name"]:
            data["name"] = options["name"]
        if options["batch_size"] is not None:
            data["batch_size"] = options["batch_size"]
        return data

    def summary(self, job: Job) -> str:
        published = unit_result(job, "publish")
        return (
            f"backup {job.input['name']} published and verified: {published.get('tables')} "
            f"tables, {published.get('rows')} rows in {published.get('path')}"
        )
