"""``python manage.py enable_schedule NAME``."""

from __future__ import annotations

import argparse
from typing import Any
from zoneinfo import ZoneInfo

from django.core.management.base import BaseCommand, CommandError

from durable.models.schedules import Schedule
from durable.schedules.service import set_enabled


class Command(BaseCommand):
    help = (
        "Enable a schedule. Its next occurrence is the first one from now: occurrences "
        "that fell while it was disabled are not caught up."
    )
    enabled = True

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            schedule = set_enabled(str(options["name"]), self.enabled)
        except Schedule.DoesNotExist:
            raise CommandError(f"there is no schedule named {options['name']!r}") from None
        if schedule.enabled:
            next_at = schedule.next_run_at  # enabling computed it
            zone = ZoneInfo(schedule.zone)
            next_run = next_at.astimezone(zone).isoformat(timespec="seconds") if next_at else "-"
            self.stdout.write(f"schedule {schedule.name} enabled; next run {next_run}")
        else:
            self.stdout.write(f"schedule {schedule.name} disabled")
