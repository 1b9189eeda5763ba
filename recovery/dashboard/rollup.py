"""Throughput counts: live for the newest hour, from a durable hourly rollup before it.

A per-hour chart over 7 days would otherwise read every job finished in them (80,000
index entries at 100,000 jobs, ~80-140 ms). A closed hour cannot change — except by a
finish stamped before its transaction committed (the stamp is taken before the lock
wait: SQLite's busy timeout, a row lock, clock skew between hosts) — so an hour is
counted once, ``SETTLE`` after it closed, the first time a chart needs it, and kept in
``ThroughputCount`` (per hour, queue, operation and kind) with a ``ThroughputHour``
marker, for every process and every later request. Hours not settled yet (the open
one, and the previous one during its first ``SETTLE``) are counted live.

History, not the present: a counted hour keeps its jobs after they are discarded,
purged, or (failed) retried by hand — the chart says what happened. The console's
Discard counts the settled hours first, so a job discarded from it stays counted
unless it finished less than about an hour ago. The engine's hot path writes nothing
for this: the rollup is written by the reader that first needs an hour.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.db.models import Sum
from django.utils import timezone

from durable.models import Job, JobEvent, database_now

from . import throughput as tp
from .models import ThroughputCount, ThroughputHour

log = logging.getLogger("recovery.dashboard")

HOUR = timedelta(hours=1)
SETTLE = timedelta(minutes=5)  # a closed hour is counted for good this long after it closed
KEEP = timedelta(days=8)  # counted hours older than the longest range (7 days) are dropped

Counts = dict[tuple[datetime, str], int]

# For backup, restore and db.copy (``durable.builtin.derived``): never moved or compared.
DERIVED_MODELS = ("recovery.throughputhour", "recovery.throughputcount")
SOURCE_MODELS = ("durable.job", "durable.jobevent")


def forget(alias: str) -> None:
    """Drop every counted hour on ``alias``: the next chart counts them again."""
    with transaction.atomic(using=alias):
        ThroughputCount.objects.using(alias).all().delete()
        ThroughputHour.objects.using(alias).all().delete()


def slot_sql(column: str, step: timedelta, vendor: str) -> str:
    """SQL of the slot (minute or hour, UTC) a timestamp column falls in, evaluated in C.

    Not Django's TruncMinute: on SQLite that calls back into Python once per row, which
    costs ~1 s for the 30,000 jobs a busy hour finishes. SQLite stores UTC text
    ("2026-12-03 06:34:49.123456"), so a prefix of it is the slot.
    """
    hourly = step >= HOUR
    if vendor == "postgresql":
        return f"date_trunc('{'hour' if hourly else 'minute'}', {column} AT TIME ZONE 'UTC')"
    return f"substr({column}, 1, {13 if hourly else 16})"


def parse_slot(value: Any) -> datetime:
    """A slot as ``slot_sql`` returns it (text on SQLite, a naive UTC timestamp on
    PostgreSQL) as an aware UTC datetime."""
    if isinstance(value, str):
        text = value if len(value) > 13 else f"{value}:00"
        return datetime.fromisoformat(text).replace(tzinfo=UTC)
    return value.replace(tzinfo=UTC) if timezone.is_naive(value) else value.astimezone(UTC)


def _as_hour(value: Any) -> datetime:
    """A marker's hour as RETURNING gives it (SQLite: the stored UTC text)."""
    if isinstance(value, str):
        return datetime.fromisoformat(value).replace(tzinfo=UTC)
    return value.astimezone(UTC)


def settled_until(now: datetime) -> datetime:
    """Hours starting before this are closed and settled: counted once, then read. Pure."""
    return tp.slot_start(now - SETTLE, HOUR)


def hours_between(start: datetime, end: datetime) -> list[datetime]:
    """The hour starts in [start, end), ``start`` rounded up to a whole hour. Pure."""
    first = tp.slot_start(start, HOUR)
    if first < start:
        first += HOUR
    out = []
    while first < end:
        out.append(first)
        first += HOUR
    return out


def _grouped(
    start: datetime,
    step: timedelta,
    *,
    end: datetime | None = None,
    queue: str = "",
    operation: str = "",
    by_queue: bool = False,
) -> list[tuple[datetime, str, str, str, int]]:
    """(slot, queue, operation, kind, n) counted from the jobs and the retry events in
    [start, end): two grouped queries on indexed columns (``durable_job_finished``,
    covering; the retry events' partial index, whose condition is stated literally so
    that SQLite uses it). Queue and operation are "" unless ``by_queue``."""
    vendor = connection.vendor
    jobs_table = connection.ops.quote_name(Job._meta.db_table)
    events_table = connection.ops.quote_name(JobEvent._meta.db_table)
    adapt = connection.ops.adapt_datetimefield_value
    narrow, narrow_params = "", []
    if queue:
        narrow += " AND j.queue = %s"
        narrow_params.append(queue)
    if operation:
        narrow += " AND j.operation = %s"
        narrow_params.append(operation)
    job_until = event_until = ""
    bounds = [adapt(start)]
    if end is not None:
        job_until, event_until = " AND j.finished_at < %s", " AND e.created_at < %s"
        bounds.append(adapt(end))
    keys = ", j.queue, j.operation" if by_queue else ", '', ''"
    groups = "1, 2, 3, 4" if by_queue else "1, 4"
    # Only quoted table names and fixed fragments are formatted in; values are parameters.
    finished = (
        f"SELECT {slot_sql('j.finished_at', step, vendor)}{keys}, j.state, count(*) "  # noqa: S608
        f"FROM {jobs_table} j WHERE j.finished_at >= %s{job_until}{narrow} GROUP BY {groups}"
    )
    join = f" JOIN {jobs_table} j ON j.id = e.job_id" if (narrow or by_queue) else ""
    retried = (
        f"SELECT {slot_sql('e.created_at', step, vendor)}{keys}, 'retried', count(*) "  # noqa: S608
        f"FROM {events_table} e{join} WHERE e.kind = 'retry_scheduled' "
        f"AND e.created_at >= %s{event_until}{narrow} GROUP BY {groups}"
    )
    rows = []
    with connection.cursor() as cursor:
        for sql_text in (finished, retried):
            cursor.execute(sql_text, [*bounds, *narrow_params])
            for slot, q, op, kind, n in cursor.fetchall():
                if kind in tp.KINDS:  # cancelled: not filtered in SQL, so that only the
                    # finished_at index applies (a state index would need every row)
                    rows.append((parse_slot(slot), q, op, kind, n))
    return rows


def live_counts(
    start: datetime, range_name: str, *, queue: str = "", operation: str = ""
) -> Counts:
    """(slot, kind) → count since ``start``, counted from the jobs now."""
    counts: Counts = {}
    step = tp.RANGES[range_name][0]
    for slot, _, _, kind, n in _grouped(start, step, queue=queue, operation=operation):
        counts[(slot, kind)] = counts.get((slot, kind), 0) + n
    return counts


def count_settled(start: datetime, now: datetime) -> bool:
    """Count every settled hour from ``start`` not counted yet (one grouped read over
    them, one short write). False when the write failed: the caller counts live.

    Two processes may count the same hours at once: the markers are inserted with ON
    CONFLICT DO NOTHING ... RETURNING, and only the hours whose marker this process
    inserted get its counts, in the same transaction.
    """
    end = settled_until(now)
    wanted = hours_between(start, end)
    if not wanted:
        return True
    have = set(
        ThroughputHour.objects.filter(hour__gte=wanted[0], hour__lt=end).values_list(
            "hour", flat=True
        )
    )
    missing = [h for h in wanted if h not in have]
    if not missing:
        return True
    low, high = missing[0], missing[-1] + HOUR
    rows = _grouped(low, HOUR, end=high, by_queue=True)
    marker = connection.ops.quote_name(ThroughputHour._meta.db_table)
    adapt = connection.ops.adapt_datetimefield_value
    stamp = adapt(timezone.now())
    values = ", ".join(["(%s, %s)"] * len(missing))
    params = [p for h in missing for p in (adapt(h), stamp)]
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(
                    f"INSERT INTO {marker} (hour, counted_at) VALUES {values} "  # noqa: S608
                    "ON CONFLICT (hour) DO NOTHING RETURNING hour",
                    params,
                )
                mine = {_as_hour(h) for (h,) in cursor.fetchall()}
            ThroughputCount.objects.bulk_create(
                [
                    ThroughputCount(hour=h, queue=q, operation=op, kind=kind, count=n)
                    for h, q, op, kind, n in rows
                    if h in mine and n
                ],
                batch_size=500,
            )
            old = now - KEEP
            ThroughputCount.objects.filter(hour__lt=old).delete()
            ThroughputHour.objects.filter(hour__lt=old).delete()
    except DatabaseError:
        log.warning("throughput rollup not written; counted live", exc_info=True)
        return False
    return True


def count_before_deleting() -> None:
    """Before the console discards jobs: count the settled hours of the longest range not
    counted yet, so that the discarded jobs stay in the history (see the module doc).
    Cheap once counted (one indexed read of the markers)."""
    now = database_now()
    count_settled(tp.first_slot(now, "week"), now)


def hourly_counts(
    start: datetime, now: datetime, range_name: str, *, queue: str = "", operation: str = ""
) -> Counts:
    """(hour, kind) → count since ``start``: the settled hours from the rollup (counted
    first if need be), the newer ones live."""
    end = settled_until(now)
    if end <= start or not count_settled(start, now):
        return live_counts(start, range_name, queue=queue, operation=operation)
    rows = ThroughputCount.objects.filter(hour__gte=start, hour__lt=end)
    if queue:
        rows = rows.filter(queue=queue)
    if operation:
        rows = rows.filter(operation=operation)
    counts = live_counts(end, range_name, queue=queue, operation=operation)
    for hour, kind, n in rows.values_list("hour", "kind").annotate(n=Sum("count")):
        key = (hour.astimezone(UTC), kind)
        counts[key] = counts.get(key, 0) + n
    return counts
