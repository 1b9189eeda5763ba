"""Finished jobs, HTTP retries and reclaims: settled totals plus what happened since.

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

from ..models import Job, JobEvent
from ..models.metrics import FinishedTotal, HttpRetryTotal, MetricsCursor, ReclaimTotal
from ..states import JobState

log = logging.getLogger("durable.metrics")

# Upper bounds (seconds) of the run-time histogram: a webhook to a day-long export.
RUN_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 1800.0, 3600.0, 21600.0, 86400.0)
FINISHED = (JobState.COMPLETED.value, JobState.FAILED.value, JobState.CANCELLED.value)
# The gap between a finish's stamp and its commit is a lock wait (seconds); two minutes
# is ample, and keeps the live part — counted on every scrape — to a few minutes of jobs.
SETTLE = timedelta(minutes=2)
ADVANCE = timedelta(seconds=30)
CURSOR = "finished"
BEGINNING = datetime(2000, 1, 1, tzinfo=UTC)

Key = tuple[str, str, str]  # queue, operation, outcome
HttpKey = tuple[str, str]  # provider, source
ReclaimKey = tuple[str, bool]  # operation, attempt_spent
HTTP_RETRY_CLASS = "durable.http.errors.HttpRetryLater"
HTTP_SOURCES = ("retry-after", "backoff")
OTHER_PROVIDER = "other"  # a provider name the settings do not list: kept out of the labels


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
        f"WHERE finished_at >= %s{until} GROUP BY queue, operation, state"
    )
    out: dict[Key, Tally] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for queue, operation, state, n, ran, total, *per_bucket in cursor.fetchall():
            if state not in FINISHED:  # filtered here: a state condition in SQL makes
                continue  # SQLite pick the state index over the finished_at range
            out[(queue, operation, state)] = Tally(
                count=int(n),
                run_count=int(ran),
                run_sum=float(total or 0),
                buckets=[int(v or 0) for v in per_bucket],
            )
    return out


@dataclass
class HttpTally:
    """Retries of one provider and source, and the seconds they told jobs to wait."""

    count: int = 0
    wait_seconds: float = 0.0


def classify_retry(message: str, providers: frozenset[str]) -> HttpKey:
    """(provider, source) of an outbound HTTP retry from its recorded message, which
    ``durable.http.client`` starts with the provider's name and ends, when the server
    said when, with "(retry-after)". A provider the settings do not name counts as
    "other", so that no free text becomes a label. Pure."""
    name = message.split(":", 1)[0].strip()
    provider = name if name in providers else OTHER_PROVIDER
    return provider, "retry-after" if "(retry-after)" in message else "backoff"


def known_providers() -> frozenset[str]:
    from django.conf import settings

    return frozenset(getattr(settings, "DURABLE_HTTP_PROVIDERS", None) or {}) | {"default"}


def as_utc(value: Any) -> datetime:
    """A timestamp as the raw cursor gives it (SQLite: UTC text) as an aware UTC datetime."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def http_counted(start: datetime, end: datetime | None = None) -> dict[HttpKey, HttpTally]:
    """Outbound HTTP retries scheduled in [start, end): the retry events' partial index
    (its condition stated literally, so that SQLite uses it), HTTP ones picked in SQL."""
    table = connection.ops.quote_name(JobEvent._meta.db_table)
    if connection.vendor == "postgresql":
        fact = "e.data ->> '{}'"
    else:
        fact = "json_extract(e.data, '$.{}')"
    adapt = connection.ops.adapt_datetimefield_value
    params: list[Any] = [adapt(start), HTTP_RETRY_CLASS]
    until = ""
    if end is not None:
        until = " AND e.created_at < %s"
        params.insert(1, adapt(end))
    sql = (
        f"SELECT e.message, e.created_at, {fact.format('next_attempt_at')} "  # noqa: S608
        f"FROM {table} e WHERE e.kind = 'retry_scheduled' AND e.created_at >= %s{until} "
        f"AND {fact.format('error_class')} = %s"
    )
    providers = known_providers()
    out: dict[HttpKey, HttpTally] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for message, created_at, due in cursor.fetchall():
            tally = out.setdefault(classify_retry(message or "", providers), HttpTally())
            tally.count += 1
            if due:
                wait = (as_utc(due) - as_utc(created_at)).total_seconds()
                tally.wait_seconds += max(wait, 0.0)
    return out


def merge_http(*parts: dict[HttpKey, HttpTally]) -> dict[HttpKey, HttpTally]:
    """The sum of several (provider, source) → HttpTally maps. Pure."""
    out: dict[HttpKey, HttpTally] = {}
    for part in parts:
        for key, tally in part.items():
            mine = out.setdefault(key, HttpTally())
            mine.count += tally.count
            mine.wait_seconds += tally.wait_seconds
    return out


def reclaims_counted(start: datetime, end: datetime | None = None) -> dict[ReclaimKey, int]:
    """Jobs reclaimed in [start, end), by operation and whether the attempt was spent: the
    reclaimed events' partial index (its condition stated literally, so that SQLite uses it)."""
    events = connection.ops.quote_name(JobEvent._meta.db_table)
    jobs = connection.ops.quote_name(Job._meta.db_table)
    if connection.vendor == "postgresql":
        spent = "e.data ->> 'attempt_spent'"
    else:
        spent = "json_extract(e.data, '$.attempt_spent')"
    adapt = connection.ops.adapt_datetimefield_value
    params: list[Any] = [adapt(start)]
    until = ""
    if end is not None:
        until = " AND e.created_at < %s"
        params.append(adapt(end))
    sql = (
        f"SELECT j.operation, {spent}, count(*) FROM {events} e "  # noqa: S608
        f"JOIN {jobs} j ON j.id = e.job_id "
        f"WHERE e.kind = 'reclaimed' AND e.created_at >= %s{until} GROUP BY 1, 2"
    )
    out: dict[ReclaimKey, int] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for operation, was_spent, n in cursor.fetchall():
            # An event of an older release has no attempt_spent: every death spent one then.
            key = (operation, was_spent in (True, 1, "true", None))
            out[key] = out.get(key, 0) + int(n)
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
            for (provider, source), http in http_counted(upto, to).items():
                HttpRetryTotal.objects.get_or_create(provider=provider, source=source)
                HttpRetryTotal.objects.filter(provider=provider, source=source).update(
                    count=F("count") + http.count,
                    wait_seconds=F("wait_seconds") + http.wait_seconds,
                )
            for (operation, spent), n in reclaims_counted(upto, to).items():
                ReclaimTotal.objects.get_or_create(operation=operation, attempt_spent=spent)
                ReclaimTotal.objects.filter(operation=operation, attempt_spent=spent).update(
                    count=F("count") + n
                )
    except DatabaseError:
        log.warning("metrics totals not advanced; counted live", exc_info=True)
        return False
    return True


def settle(now: datetime) -> datetime:
    """Advance the totals if due; the cursor they reach (what to count live from)."""
    upto = MetricsCursor.objects.filter(name=CURSOR).values_list("upto", flat=True).first()
    target = next_upto(upto or BEGINNING, now)
    if target is not None:
        advance(upto, target)
    upto = MetricsCursor.objects.filter(name=CURSOR).values_list("upto", flat=True).first()
    return upto or BEGINNING


def finished_totals(upto: datetime) -> dict[Key, Tally]:
    """Every finished job since the totals began, by queue, operation and outcome (call
    after ``settle``)."""
    _, totals = stored()
    return merge(totals, counted(upto))


def http_totals(upto: datetime) -> dict[HttpKey, HttpTally]:
    """Every outbound HTTP retry since the totals began (call after ``settle``)."""
    kept = {
        (t.provider, t.source): HttpTally(count=t.count, wait_seconds=t.wait_seconds)
        for t in HttpRetryTotal.objects.all()
    }
    return merge_http(kept, http_counted(upto))


def reclaim_totals(upto: datetime) -> dict[ReclaimKey, int]:
    """Every reclaim since the totals began (call after ``settle``)."""
    out = {(t.operation, t.attempt_spent): t.count for t in ReclaimTotal.objects.all()}
    for key, n in reclaims_counted(upto).items():
        out[key] = out.get(key, 0) + n
    return out
