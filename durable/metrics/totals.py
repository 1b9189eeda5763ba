"""Finished jobs: settled totals (``FinishedTotal``) plus the jobs finished since.

A job's finish is stamped before its transaction commits (a lock wait, a busy
SQLite, clock skew between hosts), so an interval is added to the totals only
``SETTLE`` after it ended, and at most every ``ADVANCE``; the rest is counted live
on each scrape through the ``durable_job_finished`` index (finished_at first).
Two web processes may try to advance at once: the cursor moves by a conditional
UPDATE, and only the process whose UPDATE matched adds the interval's counts, in
the same transaction.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.db.models import F

from ..models import Job
from ..states import JobState
from .models import FinishedTotal, MetricsCursor

log = logging.getLogger("durable.metrics")

# Upper bounds (seconds) of the run-time histogram: a webhook to a day-long export.
RUN_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 1800.0, 3600.0, 21600.0, 86400.0)
FINISHED = (JobState.COMPLETED.value, JobState.FAILED.value, JobState.CANCELLED.value)
SETTLE = timedelta(minutes=5)
ADVANCE = timedelta(minutes=1)
CURSOR = "finished"
BEGINNING = datetime(2000, 1, 1, tzinfo=UTC)

Key = tuple[str, str, str]  # queue, operation, outcome


@dataclass
class Tally:
    """Finished jobs of one key: how many, and the run-time histogram of those that ran."""

    count: int = 0
    run_count: int = 0
    run_sum: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * len(RUN_BUCKETS))

    def add(self, other: Tally) -> None:
        self.count += other.count
        self.run_count += other.run_count
        self.run_sum += other.run_sum
        self.buckets = [a + b for a, b in zip(self.buckets, other.buckets, strict=True)]


def merge(*parts: dict[Key, Tally]) -> dict[Key, Tally]:
    """The sum of several key → Tally maps. Pure."""
    out: dict[Key, Tally] = {}
    for part in parts:
        for key, tally in part.items():
            out.setdefault(key, Tally()).add(tally)
    return out


def next_upto(upto: datetime, now: datetime) -> datetime | None:
    """Where the cursor moves now, or None to leave it (less than ADVANCE to gain). Pure."""
    target = now - SETTLE
    return target if target - upto >= ADVANCE else None


def counted(start: datetime, end: datetime | None = None) -> dict[Key, Tally]:
    """Jobs finished in [start, end): one grouped query on the finished_at index."""
    table = connection.ops.quote_name(Job._meta.db_table)
    if connection.vendor == "postgresql":
        seconds = "EXTRACT(EPOCH FROM (finished_at - started_at))"
    else:
        seconds = "((julianday(finished_at) - julianday(started_at)) * 86400.0)"
    buckets = ", ".join(f"SUM(CASE WHEN {seconds} <= {b!r} THEN 1 ELSE 0 END)" for b in RUN_BUCKETS)
    adapt = connection.ops.adapt_datetimefield_value
    params: list[Any] = [adapt(start)]
    until = ""
    if end is not None:
        until = " AND finished_at < %s"
        params.append(adapt(end))
    # Only the quoted table name and fixed fragments are formatted in; values are parameters.
    sql = (
        f"SELECT queue, operation, state, count(*), count(started_at), "  # noqa: S608
        f"COALESCE(SUM({seconds}), 0), {buckets} FROM {table} "
        f"WHERE finished_at >= %s{until} AND state IN ('completed', 'failed', 'cancelled') "
        "GROUP BY queue, operation, state"
    )
    out: dict[Key, Tally] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for queue, operation, state, n, ran, total, *per_bucket in cursor.fetchall():
            out[(queue, operation, state)] = Tally(
                count=int(n),
                run_count=int(ran),
                run_sum=float(total or 0),
                buckets=[int(v or 0) for v in per_bucket],
            )
    return out


def stored() -> tuple[datetime | None, dict[Key, Tally]]:
    cursor = MetricsCursor.objects.filter(name=CURSOR).values_list("upto", flat=True).first()
    totals = {
        (t.queue, t.operation, t.outcome): Tally(
            count=t.count,
            run_count=t.run_count,
            run_sum=t.run_sum,
            buckets=list(t.run_buckets) or [0] * len(RUN_BUCKETS),
        )
        for t in FinishedTotal.objects.all()
    }
    return cursor, totals


def advance(upto: datetime | None, to: datetime) -> bool:
    """Add the jobs finished in [upto, to) to the totals and move the cursor, unless
    another process moved it first. False when nothing was written."""
    try:
        with transaction.atomic():
            if upto is None:
                created = MetricsCursor.objects.bulk_create(
                    [MetricsCursor(name=CURSOR, upto=BEGINNING)], ignore_conflicts=True
                )
                upto = BEGINNING if created else None
                if upto is None:
                    return False
            moved = MetricsCursor.objects.filter(name=CURSOR, upto=upto).update(upto=to)
            if not moved:
                return False  # a peer counted this interval
            for (queue, operation, outcome), tally in counted(upto, to).items():
                row, _ = FinishedTotal.objects.select_for_update().get_or_create(
                    queue=queue, operation=operation, outcome=outcome
                )
                have = list(row.run_buckets) or [0] * len(RUN_BUCKETS)
                FinishedTotal.objects.filter(pk=row.pk).update(
                    count=F("count") + tally.count,
                    run_count=F("run_count") + tally.run_count,
                    run_sum=F("run_sum") + tally.run_sum,
                    run_buckets=[a + b for a, b in zip(have, tally.buckets, strict=True)],
                )
    except DatabaseError:
        log.warning("finished-job totals not advanced; counted live", exc_info=True)
        return False
    return True


def finished_totals(now: datetime) -> dict[Key, Tally]:
    """Every finished job since the totals began, by queue, operation and outcome."""
    upto, _ = stored()
    target = next_upto(upto or BEGINNING, now)
    if target is not None:
        advance(upto, target)
    upto, totals = stored()
    return merge(totals, counted(upto or BEGINNING))
