"""``python manage.py runworker``: run durable jobs until stopped."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TypedDict, cast

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from durable.checks import check_settings
from durable.operations import registered
from durable.worker import MAX_WORKER_ID_PREFIX, Worker, default_worker_id


def valid_positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def valid_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < 86400:
        raise argparse.ArgumentTypeError("must be between 0 and 86400 seconds")
    return value


def valid_queue(text: str) -> str:
    if not text or len(text) > 64 or not text.replace("-", "").replace("_", "").isalnum():
        raise argparse.ArgumentTypeError(f"{text!r}: a queue name is 1-64 letters, digits, - or _")
    return text


def valid_worker_id(text: str) -> str:
    """A prefix for the worker id: printable, no spaces, at most 150 characters."""
    if not text or len(text) > MAX_WORKER_ID_PREFIX or not text.isprintable() or " " in text:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a worker id is 1-{MAX_WORKER_ID_PREFIX} printable characters, no spaces"
        )
    return text


class Options(TypedDict):
    """The options ``add_arguments`` defines, as its parser hands them to ``handle``."""

    concurrency: int
    queues: list[str] | None
    claim_batch: int | None
    burst: bool
    max_jobs: int | None
    lease_seconds: float
    poll_interval: float
    grace_seconds: float
    worker_id: str | None
    operations: list[str] | None


class Command(BaseCommand):
    help = (
        "Run durable jobs. SIGTERM/SIGINT stop claiming, finish the current unit, "
        "release leases and exit 0; a second signal exits at once."
    )
    # Django's full system checks import every URLconf and view (the dashboard, the API)
    # and cost a sixth of a worker's start-up; a worker that a crash-looping deploy
    # restarts every second needs to claim soon. Only the engine's own settings are
    # checked here (handle()); `manage.py check` at deploy time checks the rest.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--concurrency",
            type=valid_positive_int,
            default=1,
            help="threads running jobs in this process (default 1)",
        )
        parser.add_argument(
            "--queue",
            dest="queues",
            action="append",
            type=valid_queue,
            help="queue to take jobs from; repeatable (default: default)",
        )
        parser.add_argument(
            "--claim-batch",
            type=valid_positive_int,
            default=None,
            help=(
                "most jobs one claim takes for threads that want a job at the same moment; "
                "1 makes every thread claim alone (default: --concurrency)"
            ),
        )
        parser.add_argument("--burst", action="store_true", help="exit 0 once no due job is left")
        parser.add_argument(
            "--max-jobs",
            type=valid_positive_int,
            default=None,
            help="exit after running this many jobs",
        )
        parser.add_argument(
            "--lease-seconds", type=valid_seconds, default=settings.DURABLE_LEASE_SECONDS
        )
        parser.add_argument(
            "--poll-interval", type=valid_seconds, default=settings.DURABLE_POLL_INTERVAL
        )
        parser.add_argument(
            "--grace-seconds", type=valid_seconds, default=settings.DURABLE_GRACE_SECONDS
        )
        parser.add_argument(
            "--worker-id",
            type=valid_worker_id,
            default=None,
            help=(
                "prefix of the identity in leases and logs; a random suffix is added at "
                "every start, so a restarted process never reuses one (default host:pid)"
            ),
        )
        parser.add_argument(
            "--operation",
            dest="operations",
            action="append",
            help="only run these operations; repeatable (default: all registered)",
        )

    def handle(self, *args: object, **given: object) -> None:
        options = cast(Options, given)  # argparse's values, typed once in Options
        errors = [m for m in check_settings() if m.is_serious()]
        if errors:
            raise CommandError("; ".join(f"{m.id}: {m.msg} {m.hint or ''}".strip() for m in errors))
        ops = options["operations"]
        if ops:
            unknown = sorted(set(ops) - set(registered()))
            if unknown:
                raise CommandError(f"unknown operation(s): {', '.join(unknown)}")
        if options["lease_seconds"] < 0.3:
            raise CommandError("--lease-seconds must be at least 0.3")
        worker = Worker(
            worker_id=default_worker_id(options["worker_id"]),
            queues=options["queues"] or ["default"],
            concurrency=options["concurrency"],
            burst=options["burst"],
            lease_seconds=options["lease_seconds"],
            poll_interval=options["poll_interval"],
            grace_seconds=options["grace_seconds"],
            max_jobs=options["max_jobs"],
            operations=ops,
            claim_batch=options["claim_batch"],
        )
        code = worker.run()
        if worker.abandoned_units:
            # Threads still inside a unit cannot be interrupted; leave without
            # waiting for them (their leases expire and the jobs are reclaimed).
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        if code:
            raise SystemExit(code)
