"""Running totals for ``GET /metrics``, so a scrape reads minutes, not history.

A Prometheus counter must only go up, and a scrape must stay cheap at 100,000 jobs
and more. So the jobs that finished before ``SETTLE`` ago are added, once, to
``FinishedTotal`` (per queue, operation and outcome, with the run-time histogram's
buckets), and ``MetricsCursor`` says up to when; a scrape reads those totals and counts
only the jobs finished since the cursor. Purging or retrying jobs by hand never lowers
a total. Written by the scrape that first needs an interval (at most every 30 seconds), never
by the engine's hot path.
"""

from __future__ import annotations

from django.db import models

from ..builtin.derived import register_derived
from ..rules import QUEUE_NAME_MAX


class MetricsCursor(models.Model):
    """Jobs finished before ``upto`` are in ``FinishedTotal``; one row per ``name``."""

    name = models.CharField(max_length=32, unique=True)
    upto = models.DateTimeField()

    class Meta:
        db_table = "durable_metrics_cursor"

    def __str__(self) -> str:
        return f"{self.name} counted up to {self.upto:%Y-%m-%d %H:%M:%S}"


class FinishedTotal(models.Model):
    """Jobs finished (before the cursor) with this queue, operation and outcome."""

    queue = models.CharField(max_length=QUEUE_NAME_MAX)
    operation = models.CharField(max_length=100)
    outcome = models.CharField(max_length=12)  # completed | failed | cancelled
    count = models.PositiveBigIntegerField(default=0)
    # Jobs that ran (a start time): the run-time histogram's count, sum and buckets
    # (cumulative, one per bound of durable.metrics.collector.RUN_BUCKETS).
    run_count = models.PositiveBigIntegerField(default=0)
    run_sum = models.FloatField(default=0.0)
    run_buckets = models.JSONField(default=list)

    class Meta:
        db_table = "durable_metrics_finished"
        constraints = [
            models.UniqueConstraint(
                fields=["queue", "operation", "outcome"], name="durable_metrics_finished_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.queue}/{self.operation} {self.outcome}: {self.count}"


class HttpRetryTotal(models.Model):
    """Outbound HTTP retries scheduled (before the cursor), per provider and why: the
    server's ``Retry-After`` or our own backoff; and the seconds they made jobs wait."""

    provider = models.CharField(max_length=100)
    source = models.CharField(max_length=16)  # retry-after | backoff
    count = models.PositiveBigIntegerField(default=0)
    wait_seconds = models.FloatField(default=0.0)

    class Meta:
        db_table = "durable_metrics_http_retries"
        constraints = [
            models.UniqueConstraint(
                fields=["provider", "source"], name="durable_metrics_http_retries_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.provider} {self.source}: {self.count}"


class ReclaimTotal(models.Model):
    """Jobs taken back from a lost worker (before the cursor), per operation and whether
    the lost attempt was spent: counted here so the retention purge, which deletes the
    finished jobs' events, never lowers ``durable_reclaims``."""

    operation = models.CharField(max_length=100)
    attempt_spent = models.BooleanField()
    count = models.PositiveBigIntegerField(default=0)

    class Meta:
        db_table = "durable_metrics_reclaims"
        constraints = [
            models.UniqueConstraint(
                fields=["operation", "attempt_spent"], name="durable_metrics_reclaims_unique"
            ),
        ]

    def __str__(self) -> str:
        spent = "spent" if self.attempt_spent else "not spent"
        return f"{self.operation} ({spent}): {self.count}"


def forget(alias: str) -> None:
    """Drop the totals on ``alias``: the next scrape counts the jobs it holds again (a
    counter reset, which Prometheus expects after a restore)."""
    FinishedTotal.objects.using(alias).all().delete()
    HttpRetryTotal.objects.using(alias).all().delete()
    ReclaimTotal.objects.using(alias).all().delete()
    MetricsCursor.objects.using(alias).all().delete()


# Counted from the jobs: backup, restore and db.copy never move them (a copy's own scrape
# would change them under its comparison); they are counted again on the target.
register_derived(
    "durable.metrics",
    tables=(
        "durable.metricscursor",
        "durable.finishedtotal",
        "durable.httpretrytotal",
        "durable.reclaimtotal",
    ),
    sources=("durable.job", "durable.jobevent"),
    rebuild=forget,
)
