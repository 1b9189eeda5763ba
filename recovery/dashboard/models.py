"""Per-day counts of Recovery events, and how far SQLite's search index has caught up.

The Summary chart needs events per day and the Recovery page needs its totals
(All / Done / Failed / Deleted). Counting a million rows on every page view is
too slow, so the counts are kept here (see ``recovery.dashboard.sql``). The
day is the event's own time (``ts``, else ``recorded_at``) in UTC.

On PostgreSQL triggers keep them in the inserting statement itself. On SQLite
the search index and these counts are *deferred*: events up to
``SearchCursor.indexed_upto`` are indexed and counted, newer ones (the tail)
are scanned and counted directly by every reader, and the indexer
(``recovery.search_index``) moves the cursor on in bulk. The ingest then
writes each line once, instead of also updating a trigram index row by row.
"""

from __future__ import annotations

from django.db import models

from durable.rules import QUEUE_NAME_MAX


class DailyCount(models.Model):
    day = models.DateField()
    failed = models.BooleanField(help_text="done is false")
    deleted = models.BooleanField(help_text="deleted_data")
    # For GET /metrics (recovery_events{severity,failed}): one of recovery.models.Severity.
    severity = models.CharField(max_length=7, default="info")
    events = models.BigIntegerField(default=0)

    class Meta:
        db_table = "recovery_dailycount"
        constraints = [
            models.UniqueConstraint(
                fields=["day", "failed", "deleted", "severity"], name="recovery_dailycount_unique"
            ),
        ]

    def __str__(self) -> str:
        return (
            f"{self.day} failed={self.failed} deleted={self.deleted} {self.severity}: {self.events}"
        )


class SearchCursor(models.Model):
    """SQLite only: events with ``id <= indexed_upto`` are in the FTS index and in DailyCount.

    SQLite writes one transaction at a time and ids come from AUTOINCREMENT,
    so an id is never committed below the cursor after it moved: "everything
    up to N" is exact.
    """

    indexed_upto = models.BigIntegerField(default=0)

    class Meta:
        db_table = "recovery_searchcursor"

    def __str__(self) -> str:
        return f"indexed up to {self.indexed_upto}"


class ThroughputHour(models.Model):
    """A closed hour of job history already counted into ``ThroughputCount`` (see
    ``recovery.dashboard.rollup``): its counts are read from there, never recounted."""

    hour = models.DateTimeField(unique=True, help_text="Start of the hour, UTC.")
    counted_at = models.DateTimeField()

    class Meta:
        db_table = "recovery_throughputhour"

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}h counted"


class ThroughputCount(models.Model):
    """Jobs completed, failed and retried in one closed hour, per queue and operation."""

    hour = models.DateTimeField()
    queue = models.CharField(max_length=QUEUE_NAME_MAX)
    operation = models.CharField(max_length=100)
    kind = models.CharField(max_length=12)  # completed | failed | retried
    count = models.PositiveIntegerField()

    class Meta:
        db_table = "recovery_throughputcount"
        constraints = [
            models.UniqueConstraint(
                fields=["hour", "queue", "operation", "kind"], name="recovery_throughput_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}h {self.queue}/{self.operation}: {self.count} {self.kind}"
