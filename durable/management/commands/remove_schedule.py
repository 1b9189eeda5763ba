"""``python manage.py remove_schedule NAME``."""

from __future__ import annotations

import argparse

from django.core.management.base import BaseCommand, CommandError

from durable.schedules.service import remove_schedule


class Command(BaseCommand):
    help = (
        "Delete a schedule and its occurrence records (jobs it enqueued stay). A schedule "
        "the site manages from its settings comes back at the next worker start: "
        "disable it, or turn its setting off, instead."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name")

    def handle(self, *args: object, **options: object) -> None:
        if not remove_schedule(str(options["name"])):
            raise CommandError(f"there is no schedule named {options['name']!r}")
        self.stdout.write(f"removed schedule {options['name']}")
