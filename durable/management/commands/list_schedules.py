"""``python manage.py list_schedules [NAME] [--occurrences N]``."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.core.management.base import BaseCommand, CommandError

from durable.models.schedules import Schedule
from durable.schedules.service import describe_rule


def _when(value: datetime | None, zone: str) -> str:
    if value is None:
        return "-"
    return value.astimezone(ZoneInfo(zone)).isoformat(timespec="seconds")


class Command(BaseCommand):
    help = (
        "List schedules: rule, operation, state, next and last occurrence (in each "
        "schedule's time zone). With NAME, also its latest occurrences and what each did."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name", nargs="?", default=None)
        parser.add_argument("--occurrences", type=int, default=10, help="how many, with NAME")

    def handle(self, *args: Any, **options: Any) -> None:
        schedules = Schedule.objects.order_by("name")
        if options["name"]:
            schedules = schedules.filter(name=options["name"])
            if not schedules.exists():
                raise CommandError(f"there is no schedule named {options['name']!r}")
        for schedule in schedules:
            state = "enabled" if schedule.enabled else "disabled"
            flags = " managed" if schedule.managed else ""
            self.stdout.write(
                f"{schedule.name}\t{state}{flags}\t{schedule.operation}\t{describe_rule(schedule)}"
                f"\tcatch-up {schedule.catch_up}\tnext {_when(schedule.next_run_at, schedule.zone)}"
                f"\tlast {_when(schedule.last_run_at, schedule.zone)}"
            )
            if not options["name"]:
                continue
            latest = schedule.occurrences.order_by("-scheduled_for")[
                : max(options["occurrences"], 0)
            ]
            for occurrence in latest:
                self.stdout.write(
                    f"  {_when(occurrence.scheduled_for, schedule.zone)}\t"
                    f"job {occurrence.job_id or '-'}\t{occurrence.note}"
                    + (f"\t{occurrence.missed} missed" if occurrence.missed else "")
                )
