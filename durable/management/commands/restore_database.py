"""``python manage.py restore_database NAME [--replace] [--wait | --inline]``."""

from __future__ import annotations

import argparse
from typing import Any

from durable.builtin.cli import OperationCommand, split_list, unit_result
from durable.models import Job


class Command(OperationCommand):
    help = (
        "Restore the backup DURABLE_BACKUP_DIR/NAME: every checksum is verified before any row "
        "is written; rows are upserted by primary key. Stop the site's writers first."
    )
    operation = "restore.database"

    def add_input_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name", help="the backup's directory name")
        parser.add_argument("--database", default="default", help="database alias (default)")
        parser.add_argument(
            "--replace",
            action="store_true",
            help="delete the restored tables' current rows first, so they equal the backup",
        )
        parser.add_argument(
            "--exclude", action="append", help="app or app.model to leave alone (repeatable)"
        )

    def build_input(self, options: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": options["name"],
            "database": options["database"],
            "replace": options["replace"],
            "exclude": split_list(options["exclude"]),
        }

    def summary(self, job: Job) -> str:
        done = unit_result(job, "finish")
        check = ", every table's digest matches the backup" if done.get("verified") else ""
        return (
            f"restored {job.input['name']} into {job.input['database']!r}: "
            f"{done.get('tables')} tables, {done.get('rows')} rows{check}. "
            "Restart the web and worker processes."
        )
