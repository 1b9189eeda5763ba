"""``python manage.py copy_database --target ALIAS [--replace] [--wait | --inline]``."""

from __future__ import annotations

import argparse
from typing import Any

from durable.builtin.cli import OperationCommand, split_list
from durable.models import Job


class Command(OperationCommand):
    help = (
        "Copy this site's tables (not the job tables) from one DATABASES alias to another in "
        "primary-key batches, then verify row counts and checksums on both sides."
    )
    operation = "db.copy"

    def add_input_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--source", default="default", help="alias to copy from (default)")
        parser.add_argument("--target", required=True, help="alias to copy to (already migrated)")
        parser.add_argument(
            "--replace",
            action="store_true",
            help="delete the target's rows of the copied tables first",
        )
        parser.add_argument("--batch-size", type=int, default=None, help="rows per unit")
        parser.add_argument(
            "--exclude", action="append", help="app or app.model to leave out (repeatable)"
        )

    def build_input(self, options: dict[str, Any]) -> dict[str, Any]:
        data = {
            "source": options["source"],
            "target": options["target"],
            "replace": options["replace"],
            "exclude": split_list(options["exclude"]),
        }
        if options["batch_size"] is not None:
            data["batch_size"] = options["batch_size"]
        return data

    def summary(self, job: Job) -> str:
        verified = job.unit_results.filter(key__startswith="verified:")
        rows = sum(
            (result or {}).get("rows", 0) for result in verified.values_list("result", flat=True)
        )
        return (
            f"copied {verified.count()} tables ({rows} rows) from {job.input['source']!r} to "
            f"{job.input['target']!r}; row counts and checksums match"
        )
