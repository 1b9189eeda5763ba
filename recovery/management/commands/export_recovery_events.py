"""``python manage.py export_recovery_events [--format jsonl|csv] [--output FILE]``."""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
from typing import IO

from django.core.management.base import BaseCommand, CommandError

from recovery.imports.formats import CSV_COLUMNS, export_line, export_row
from recovery.models import RecoveryEvent


class Command(BaseCommand):
    help = (
        "Write the Recovery events, oldest first, in the format import_recovery_events "
        "reads on another instance: JSONL (the recovery-events.jsonl line format) or CSV with "
        "a header row. To FILE (written to a temporary name, then renamed) or to stdout."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--format", choices=["jsonl", "csv"], default="jsonl")
        parser.add_argument("--output", default="-", help="a file, or - for stdout (default)")
        parser.add_argument("--type", action="append", default=[], help="only these types")

    def handle(self, *args: object, **options: object) -> None:
        events = RecoveryEvent.objects.order_by("id")
        if options["type"]:
            events = events.filter(type__in=options["type"])
        output = str(options["output"])
        if output == "-":
            count = self._write(sys.stdout.buffer, events, str(options["format"]))
            sys.stdout.flush()
            self.stderr.write(f"exported {_events(count)}")
            return
        directory = os.path.dirname(os.path.abspath(output))
        try:
            handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 - renamed or removed below
                dir=directory, prefix=".export-", delete=False
            )
        except OSError as exc:
            raise CommandError(f"cannot write to {directory}: {exc.strerror}") from None
        try:
            with handle:
                count = self._write(handle, events, str(options["format"]))
            os.replace(handle.name, output)  # a half-written export never has the real name
        except BaseException:
            os.unlink(handle.name)
            raise
        self.stdout.write(f"exported {_events(count)} to {output}")

    def _write(self, out: IO[bytes], events, fmt: str) -> int:
        count = 0
        if fmt == "jsonl":
            for event in events.iterator(chunk_size=2000):
                out.write(export_line(event))
                count += 1
            return count
        text = _TextOut(out)
        writer = csv.DictWriter(text, fieldnames=CSV_COLUMNS, lineterminator="\n")
        writer.writeheader()
        for event in events.iterator(chunk_size=2000):
            writer.writerow(export_row(event))
            count += 1
        return count


def _events(count: int) -> str:
    return f"{count:,} event" + ("" if count == 1 else "s")


class _TextOut:
    """The csv module writes text; the export is UTF-8 bytes."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out

    def write(self, text: str) -> int:
        return self.out.write(text.encode("utf-8"))
