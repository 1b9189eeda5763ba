"""``python manage.py integrity_scan [--storage NAME [--prefix P] | --database ALIAS]``."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import CommandError

from durable.builtin.cli import OperationCommand, unit_result
from durable.builtin.integrity import scope_of
from durable.builtin.inventory import clean_prefix
from durable.models import Job


class Command(OperationCommand):
    help = (
        "Check a storage's files against the previous scan (new, modified, corrupted, "
        "missing), or a database's tables; findings go to Problems -> Recovery."
    )
    operation = "integrity.scan"

    def add_input_arguments(self, parser: argparse.ArgumentParser) -> None:
        what = parser.add_mutually_exclusive_group()
        what.add_argument("--storage", default=None, help="a STORAGES alias (default: default)")
        what.add_argument("--database", default=None, help="a DATABASES alias")
        parser.add_argument("--prefix", default="", help="only files under this path")
        parser.add_argument("--batch-files", type=int, default=None, help="files per unit")

    def build_input(self, options: dict[str, Any]) -> dict[str, Any]:
        if options["database"]:
            return {"target": "database", "database": options["database"]}
        data = {"target": "storage", "storage": options["storage"] or "default"}
        if options["prefix"]:
            try:
                data["prefix"] = clean_prefix(options["prefix"])
            except ValueError as exc:
                raise CommandError(f"--prefix {exc}") from None
        if options["batch_files"] is not None:
            data["batch_files"] = options["batch_files"]
        return data

    def summary(self, job: Job) -> str:
        return scan_summary(job.input, unit_result(job, "report"))


def scan_summary(data: dict[str, Any], tallies: dict[str, Any]) -> str:
    """One line for the operator; "nothing to check" only when nothing was checked."""
    if data.get("target") == "database":
        tables = tallies.get("tables", 0)
        problems = tallies.get("corrupted", 0)
        found = f"{tables} tables checked, " + (f"{problems} with problems" if problems else
                                                 "no problems")  # fmt: skip
        return f"scanned {scope_of(data)}: {found if tables else 'nothing to check'}"
    order = ("checked", "new", "ok", "modified", "corrupted", "missing")
    found = ", ".join(f"{tallies[name]} {name}" for name in order if tallies.get(name))
    return f"scanned {scope_of(data)}: {found or 'nothing to check'}"
