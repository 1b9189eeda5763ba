"""``python manage.py add_schedule NAME OPERATION (--cron EXPR | --every INTERVAL) [...]``."""

from __future__ import annotations

import argparse
import json
from zoneinfo import ZoneInfo

from django.core.management.base import BaseCommand, CommandError

from durable.errors import InputRejected, UnknownOperation
from durable.schedules.service import add_schedule, describe_rule
from durable.schedules.timing import parse_interval


class Command(BaseCommand):
    help = (
        "Add a schedule: every occurrence enqueues OPERATION with --input. Cron expressions "
        "(5 fields) follow the wall clock of --time-zone (default: the TIME_ZONE setting); "
        "intervals are plain elapsed time. The first occurrence is the first one from now."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name")
        parser.add_argument("operation", help="e.g. durable.purge")
        timing = parser.add_mutually_exclusive_group(required=True)
        timing.add_argument("--cron", help="'30 3 * * *', '*/15 * * * MON-FRI', @daily, …")
        timing.add_argument("--every", help="an interval: 90s, 15m, 1h, 1d, 2w")
        parser.add_argument("--input", default="{}", help="the job input, a JSON object")
        parser.add_argument("--time-zone", default="", help="IANA name, for --cron")
        parser.add_argument(
            "--catch-up",
            choices=["latest", "skip"],
            default="latest",
            help="after downtime: run the latest missed occurrence once (default), or skip",
        )
        parser.add_argument(
            "--overlap",
            action="store_true",
            help="enqueue even while the previous occurrence's job is unfinished",
        )
        parser.add_argument("--queue", default="")
        parser.add_argument("--priority", type=int, default=None)
        parser.add_argument("--disabled", action="store_true", help="add it disabled")

    def handle(self, *args: object, **options: object) -> None:
        try:
            data = json.loads(str(options["input"]))
        except json.JSONDecodeError as exc:
            raise CommandError(f"--input is not JSON: {exc}") from None
        every = None
        if options["every"]:
            try:
                every = parse_interval(str(options["every"]))
            except ValueError as exc:
                raise CommandError(f"--every: {exc}") from None
        try:
            schedule = add_schedule(
                str(options["name"]),
                str(options["operation"]),
                cron=options["cron"] or None,  # type: ignore[arg-type]
                every=every,
                input=data,
                time_zone=str(options["time_zone"]),
                catch_up=str(options["catch_up"]),
                overlap=bool(options["overlap"]),
                queue=str(options["queue"]),
                priority=options["priority"],  # type: ignore[arg-type]
                enabled=not options["disabled"],
            )
        except (InputRejected, UnknownOperation) as exc:
            raise CommandError(str(exc)) from None
        next_run = (
            schedule.next_run_at.astimezone(ZoneInfo(schedule.zone)).isoformat(timespec="seconds")
            if schedule.next_run_at
            else "-"
        )
        self.stdout.write(
            f"added schedule {schedule.name}: {schedule.operation} {describe_rule(schedule)}; "
            f"next run {next_run}" + ("" if schedule.enabled else " (disabled)")
        )
