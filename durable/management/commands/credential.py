"""``manage.py credential set|delete|list|rotate|generate-key``: the encrypted credentials.

``set`` reads the secret from the terminal without echo (asked twice), or
from standard input when it is not a terminal (``--stdin`` forces that), so
the value never appears in shell history, ``ps`` output or this command's
output.
"""

from __future__ import annotations

import argparse
import getpass
import sys

from cryptography.fernet import Fernet
from django.core.management.base import BaseCommand, CommandError

from durable import credential_store
from durable.errors import Unavailable
from durable.sanitize import REFERENCE_NAME


def valid_name(name: str) -> str:
    if not REFERENCE_NAME.match(name):
        raise argparse.ArgumentTypeError(
            "a credential name is 1-100 letters, digits and _ . : - starting with a letter or digit"
        )
    return name


class Command(BaseCommand):
    help = "Manage encrypted credentials (values are never printed)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        setter = actions.add_parser("set", help="store or replace a credential")
        setter.add_argument("name", type=valid_name)
        setter.add_argument(
            "--stdin", action="store_true", help="read the value from standard input"
        )
        deleter = actions.add_parser("delete", help="remove a credential")
        deleter.add_argument("name", type=valid_name)
        actions.add_parser("list", help="list credential names and dates (never values)")
        actions.add_parser("rotate", help="re-encrypt every value with the first configured key")
        actions.add_parser("generate-key", help="print a new random key for DURABLE_CREDENTIAL_KEY")

    def handle(self, *args: object, **options: object) -> None:
        action = options["action"]
        try:
            if action == "set":
                self._set(str(options["name"]), bool(options["stdin"]))
            elif action == "delete":
                if not credential_store.delete(str(options["name"])):
                    raise CommandError(f"no credential named {options['name']!r}")
                self.stdout.write(f"deleted credential {options['name']!r}")
            elif action == "list":
                rows = credential_store.Credential.objects.order_by("name")
                for row in rows:
                    self.stdout.write(f"{row.name}\tupdated {row.updated_at.isoformat()}")
            elif action == "rotate":
                count = credential_store.rotate()
                self.stdout.write(f"re-encrypted {count} credential(s) with the first key")
            elif action == "generate-key":
                self.stdout.write(Fernet.generate_key().decode("ascii"))
        except Unavailable as exc:
            raise CommandError(str(exc)) from None

    def _set(self, name: str, from_stdin: bool) -> None:
        if from_stdin or not sys.stdin.isatty():
            value = sys.stdin.readline().rstrip("\r\n")
        else:
            value = getpass.getpass(f"Value for {name} (not echoed): ")
            if getpass.getpass("Again: ") != value:
                raise CommandError("the two values differ; nothing was stored")
        try:
            created = credential_store.store(name, value)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"{'stored' if created else 'replaced'} credential {name!r}")
