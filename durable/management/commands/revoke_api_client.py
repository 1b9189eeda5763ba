"""``python manage.py revoke_api_client NAME``: its token is refused from now on."""

from __future__ import annotations

import argparse

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from durable.models.api import Client


class Command(BaseCommand):
    help = "Revoke an API client's token (create_api_client NAME --rotate issues a new one)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name")

    def handle(self, *args: object, **options: object) -> None:
        changed = Client.objects.filter(name=options["name"], revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        if not changed and not Client.objects.filter(name=options["name"]).exists():
            raise CommandError(f"there is no API client named {options['name']!r}")
        self.stdout.write(f"revoked API client {options['name']!r}")
