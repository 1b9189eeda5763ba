"""``python manage.py create_api_client NAME --scope jobs:read --scope jobs:write``.

Scopes: ``jobs:read``, ``jobs:write``, ``jobs:admin`` (privileged operations
and actions on every client's jobs, on top of ``jobs:write`` or
``schedules:write``), ``schedules:read``, ``schedules:write``.

Prints the token once, alone on stdout (``TOKEN=$(python manage.py …)``);
the database keeps only its SHA-256. ``--rotate`` gives an existing client a
new token (the old one stops working at once) and lifts a revocation.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone

from durable.api.tokens import new_token
from durable.models.api import SCOPE_HELP, SCOPES, Client


class Command(BaseCommand):
    help = "Create an API client (or --rotate its token) and print the token once."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name", help="who uses the token, e.g. ci or deploy-script")
        parser.add_argument(
            "--scope",
            action="append",
            choices=SCOPES,
            default=[],
            help="repeatable; "
            + "; ".join(f"{scope}: {meaning}" for scope, meaning in SCOPE_HELP.items()),
        )
        parser.add_argument(
            "--rotate",
            action="store_true",
            help="replace the token of an existing client (keeps its scopes unless given)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name = str(options["name"]).strip()
        if not 0 < len(name) <= 100 or not name.isprintable():
            raise CommandError("NAME must be 1 to 100 printable characters")
        scopes = sorted(set(options["scope"]))
        token = new_token()
        now = timezone.now()
        with transaction.atomic():
            client = Client.objects.select_for_update().filter(name=name).first()
            if client is None:
                if options["rotate"]:
                    raise CommandError(f"there is no API client named {name!r}")
                if not scopes:
                    raise CommandError(f"give at least one --scope ({', '.join(SCOPES)})")
                client = Client.objects.create(
                    name=name, scopes=scopes, token_prefix=token.prefix, token_hash=token.hash
                )
                verb = "Created"
            elif not options["rotate"]:
                raise CommandError(f"API client {name!r} exists; use --rotate for a new token")
            else:
                client.token_prefix, client.token_hash = token.prefix, token.hash
                client.rotated_at, client.revoked_at = now, None
                if scopes:
                    client.scopes = scopes
                client.save()
                verb = "Rotated the token of"
        self.stderr.write(
            f"{verb} API client {client.name!r} (scopes: {', '.join(client.scopes)}). "
            "The token below is shown only now; store it in a secret store."
        )
        self.stdout.write(token.token)
