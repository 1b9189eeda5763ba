"""``python manage.py record_recovery_event TYPE --detail TEXT …``: an administrator's entry."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from durable.clientip import parse_address
from recovery.models import Severity
from recovery.notify import publish_recorded
from recovery.records import record_event


def valid_type(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("the event type must not be empty")
    return text


def valid_ip(text: str) -> str:
    if parse_address(text) is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an IPv4 or IPv6 address")
    return text


class Command(BaseCommand):
    help = (
        "Record a recovery event by hand (e.g. a restore done outside the app), shown in "
        "Problems → Recovery. TYPE is one of the known types (backup-created, "
        "restore-backup, manual-required…) or any other word."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("type", type=valid_type)
        parser.add_argument("--detail", default="", help="what happened, for the report")
        parser.add_argument("--severity", choices=Severity.values, default=Severity.INFO)
        parser.add_argument("--db", default="", help="the database concerned, e.g. wekan")
        parser.add_argument("--source", default="manual")
        outcome = parser.add_mutually_exclusive_group()
        outcome.add_argument("--done", dest="done", action="store_const", const=True)
        outcome.add_argument(
            "--failed", dest="done", action="store_const", const=False, help="not done"
        )
        parser.add_argument("--deleted-data", action="store_true", help="it deleted data")
        parser.add_argument("--user-id", default="")
        parser.add_argument("--username", default="")
        parser.add_argument("--ip", type=valid_ip, default=None, help="IPv4 or IPv6 address")
        parser.add_argument(
            "--object",
            dest="objects",
            action="append",
            default=[],
            metavar="ID[=TITLE]",
            help="an affected object; repeatable",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        ids, titles = [], []
        for item in options["objects"]:
            object_id, _, title = str(item).partition("=")
            ids.append(object_id)
            titles.append(title or None)
        event = record_event(
            options["type"],
            severity=options["severity"],
            detail=options["detail"],
            db=options["db"],
            source=options["source"],
            done=True if options["done"] is None else options["done"],
            deleted_data=options["deleted_data"],
            user_id=options["user_id"],
            username=options["username"],
            ip=options["ip"],
            object_ids=ids or None,
            object_titles=titles or None,
        )
        if event is None:
            raise CommandError("the event could not be recorded; the log says why")
        publish_recorded(event)  # an error goes out to the configured webhooks and mail
        self.stdout.write(f"recorded recovery event {event.pk} ({event.type})")
