"""``python manage.py problems``: the Problems page as text, for operators without a browser."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand
from django.db.models import Count
from django.utils import timezone

from durable.models import Job
from durable.states import JobState
from recovery.models import RecoveryEvent, SecurityEvent

WIDTH = 80


def valid_limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError("must be from 1 to 1000")
    return value


def cell(value: object, width: int) -> str:
    """Fit ``value`` into ``width`` columns on one line: cut with … when longer."""
    text = " ".join(str(value if value is not None else "").split())
    if len(text) > width:
        text = text[: max(width - 1, 0)] + "…"
    return text.ljust(width)


def row(*cells: tuple[object, int]) -> str:
    return "  " + " ".join(cell(value, width) for value, width in cells).rstrip()


def when(moment: datetime | None) -> str:
    if moment is None:
        return "—"
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M")


def bar(job: Job, width: int = 10) -> str:
    if not job.units_total:
        return f"{job.units_done:,} units"
    share = min(job.units_done / job.units_total, 1.0)
    filled = int(width * share)
    return f"[{'#' * filled}{'-' * (width - filled)}] {share:.0%}"


def done_mark(event: RecoveryEvent) -> str:
    """The Recovery report's Done column in words: done, FAILED, or del (done, deleted data)."""
    if not event.is_done:
        return "FAILED"
    return "del" if event.deleted_data else "done"


class Command(BaseCommand):
    help = (
        "Print a summary of what needs attention: jobs in progress with their progress, "
        "failed and paused jobs, the latest recovery problems, the latest recovery events "
        "(all of them, newest first) and the top security rows."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--limit", type=valid_limit, default=10, help="rows per section")

    def handle(self, *args: Any, **options: Any) -> None:
        limit = options["limit"]
        lines = [f"Problems — {when(timezone.now())} {timezone.get_current_timezone_name()}", ""]
        lines += self.jobs(limit)
        lines += ["", *self.recovery(limit)]
        lines += ["", *self.latest(limit)]
        lines += ["", *self.security(limit)]
        for line in lines:
            self.stdout.write(line[:WIDTH].rstrip())

    def jobs(self, limit: int) -> list[str]:
        states = dict(
            Job.objects.values_list("state").annotate(n=Count("id")).values_list("state", "n")
        )
        running = list(
            Job.objects.filter(state__in=[JobState.RUNNING, JobState.CANCELLING]).order_by("-id")[
                :limit
            ]
        )
        in_progress = states.get(JobState.RUNNING, 0) + states.get(JobState.CANCELLING, 0)
        lines = [f"Jobs in progress: {in_progress:,}"]
        if running:
            lines.append(
                row(("#", 7), ("operation", 22), ("state", 10), ("progress", 17), ("try", 7))
            )
        for job in running:
            lines.append(
                row(
                    (job.pk, 7),
                    (job.operation, 22),
                    (job.state, 10),
                    (bar(job), 17),
                    (f"{job.attempts + 1}/{job.max_attempts}", 7),
                )
            )
        retrying = Job.objects.retrying().count()
        lines.append(
            f"Failed: {states.get(JobState.FAILED, 0):,}   "
            f"Paused: {states.get(JobState.PAUSED, 0):,}   "
            f"Queued: {states.get(JobState.QUEUED, 0):,} ({retrying:,} retrying)"
        )
        attention = Job.objects.filter(state__in=[JobState.FAILED, JobState.PAUSED]).order_by(
            "-updated_at", "-id"
        )[:limit]
        for job in attention:
            lines.append(
                row((job.pk, 7), (job.operation, 22), (job.state, 8), (job.reason or "—", 37))
            )
        return lines

    def recovery(self, limit: int) -> list[str]:
        events = list(RecoveryEvent.objects.problems().newest_first()[:limit])
        lines = [f"Latest recovery problems (failed, warnings, errors): {len(events)} shown"]
        if not events:
            return [*lines, "  none"]
        lines.append(row(("recorded", 16), ("", 1), ("severity", 8), ("type", 22), ("detail", 26)))
        for event in events:
            lines.append(
                row(
                    (when(event.recorded_at), 16),
                    ("!" if event.done is False else "", 1),
                    (event.severity, 8),
                    (event.type, 22),
                    (event.detail or event.reason or "—", 26),
                )
            )
        lines.append("  ! = not done")
        return lines

    def latest(self, limit: int) -> list[str]:
        """Every kind of event, newest first: what the Recovery report's first page shows."""
        events = list(RecoveryEvent.objects.newest_first()[:limit])
        lines = [f"Latest recovery events: {len(events)} shown"]
        if not events:
            return [*lines, "  none"]
        lines.append(
            row(("recorded", 16), ("done", 6), ("severity", 8), ("type", 22), ("detail", 22))
        )
        for event in events:
            lines.append(
                row(
                    (when(event.recorded_at), 16),
                    (done_mark(event), 6),
                    (event.severity, 8),
                    (event.type, 22),
                    (event.detail or event.reason or "—", 22),
                )
            )
        lines.append("  del = done, and it deleted data")
        return lines

    def security(self, limit: int) -> list[str]:
        rows = list(SecurityEvent.objects.top()[:limit])
        lines = ["Top security rows (by count)"]
        if not rows:
            return [*lines, "  none"]
        lines.append(
            row(("count", 9), ("last seen", 16), ("severity", 8), ("category/key", 27), ("CWE", 9))
        )
        for item in rows:
            lines.append(
                row(
                    (f"{item.count:,}", 9),
                    (when(item.last_seen), 16),
                    (item.severity, 8),
                    (f"{item.category}/{item.key}", 27),
                    (item.cwe or "—", 9),
                )
            )
        return lines
