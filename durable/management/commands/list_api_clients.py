"""``python manage.py list_api_clients``: names, scopes, token prefixes, last use."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from durable.models.api import Client


def _when(value: object) -> str:
    return value.isoformat(timespec="seconds") if value else "-"  # type: ignore[attr-defined]


class Command(BaseCommand):
    help = "List API clients (never their tokens: only the public prefix is known)."

    def handle(self, *args: object, **options: object) -> None:
        for client in Client.objects.order_by("name"):
            state = "revoked" if client.revoked_at else "active"
            self.stdout.write(
                f"{client.name}\t{state}\t{','.join(client.scopes)}\tdur_{client.token_prefix}_…"
                f"\tcreated {_when(client.created_at)}\tlast used {_when(client.last_used_at)}"
            )
