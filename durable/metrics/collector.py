"""The engine's families, each one grouped query on an indexed column, at scrape time.

Labels come only from bounded sets: queue and operation names (chosen by the code that
enqueues, a handful per site), the job states, fixed outcome words, provider names
from the outbound HTTP configuration. Never a job id, a URL or a worker id.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Count, Min, Q
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.metrics_core import Metric

from ..models import Job, JobEvent, WorkerProcess, database_now
from ..policy import worker_alive
from ..states import JobState

# Upper bounds (seconds) of the run-time histogram: a webhook to a week-long export.
RUN_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 1800.0, 3600.0, 21600.0, 86400.0)
FINISHED = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)
STOPPED_WITHIN = timedelta(hours=1)  # "recently stopped" workers
WORKER_STATES = ("live", "unresponsive", "stopped")


def worker_state(
    *, stopped_at: datetime | None, heartbeat_at: datetime, lease_seconds: float, now: datetime
) -> str:
    """One of WORKER_STATES. Pure: live while it beats within its own lease window;
    unresponsive when it stopped beating without saying it stopped (killed, hung,
    its machine gone) until a peer marks it; stopped once it (or a peer) recorded it."""
    if stopped_at is not None:
        return "stopped"
    if worker_alive(heartbeat_at=heartbeat_at, lease_seconds=lease_seconds, now=now):
        return "live"
    return "unresponsive"


def run_histogram(
    rows: Iterable[tuple[str, str, list[int], int, float]],
) -> HistogramMetricFamily:
    """The histogram family from (queue, operation, per-bucket counts, count, sum) rows,
    the per-bucket counts already cumulative (as SQL sums them). Pure."""
    family = HistogramMetricFamily(
        "durable_job_run_seconds",
        "Seconds from a job's first start to its finish, for the finished jobs kept.",
        labels=["queue", "operation"],
    )
    for queue, operation, buckets, count, total in rows:
        pairs = [(_le(b), float(n)) for b, n in zip(RUN_BUCKETS, buckets, strict=True)]
        pairs.append(("+Inf", float(count)))
        family.add_metric([queue, operation], pairs, sum_value=total)
    return family


def _le(bound: float) -> str:
    return f"{bound:g}" if bound < 1e6 else str(bound)


class DurableCollector:
    """Reads the engine's tables when Prometheus scrapes; holds nothing between scrapes."""

    def describe(self) -> list[Metric]:
        return []  # families are only known by reading the database

    def collect(self) -> Iterator[Metric]:
        now = database_now()
        yield from self._jobs(now)
        yield self._finished()
        yield self._run_seconds()
        yield self._reclaims()
        yield from self._workers(now)
        yield from self._gates(now)

    def _jobs(self, now: datetime) -> Iterator[Metric]:
        by_state = GaugeMetricFamily(
            "durable_jobs", "Jobs by queue and state, now.", labels=["queue", "state"]
        )
        # Covering index durable_job_per_queue (state, queue, next_attempt_at).
        rows = Job.objects.order_by().values_list("queue", "state").annotate(n=Count("*"))
        for queue, state, n in rows:
            by_state.add_metric([queue, state], n)
        yield by_state
        oldest = GaugeMetricFamily(
            "durable_queue_oldest_ready_age_seconds",
            "How long the oldest job ready to start (queued, due) has waited; 0 if none.",
            labels=["queue"],
        )
        ready = (
            Job.objects.filter(state=JobState.QUEUED, next_attempt_at__lte=now)
            .order_by()
            .values_list("queue")
            .annotate(first=Min("next_attempt_at"))
        )
        seen = set()
        for queue, first in ready:
            seen.add(queue)
            oldest.add_metric([queue], max((now - first).total_seconds(), 0.0))
        for queue in {q for q, _, _ in rows} - seen:
            oldest.add_metric([queue], 0.0)
        yield oldest

    def _finished(self) -> Metric:
        family = CounterMetricFamily(
            "durable_jobs_finished",
            "Jobs finished, by outcome (completed, failed, cancelled), among the jobs kept.",
            labels=["queue", "operation", "outcome"],
        )
        # Index-only: durable_job_finished (finished_at, state, queue, operation).
        rows = (
            Job.objects.filter(finished_at__isnull=False, state__in=FINISHED)
            .order_by()
            .values_list("queue", "operation", "state")
            .annotate(n=Count("*"))
        )
        for queue, operation, state, n in rows:
            family.add_metric([queue, operation, state], n)
        return family

    def _run_seconds(self) -> Metric:
        table = connection.ops.quote_name(Job._meta.db_table)
        if connection.vendor == "postgresql":
            seconds = "EXTRACT(EPOCH FROM (finished_at - started_at))"
        else:
            seconds = "((julianday(finished_at) - julianday(started_at)) * 86400.0)"
        sums = ", ".join(
            f"SUM(CASE WHEN {seconds} <= {b!r} THEN 1 ELSE 0 END)" for b in RUN_BUCKETS
        )
        sql = (
            f"SELECT queue, operation, {sums}, count(*), COALESCE(SUM({seconds}), 0) "  # noqa: S608
            f"FROM {table} WHERE finished_at IS NOT NULL AND started_at IS NOT NULL "
            "AND state IN ('completed', 'failed', 'cancelled') GROUP BY queue, operation"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql)
            fetched = cursor.fetchall()
        n = len(RUN_BUCKETS)
        return run_histogram(
            (
                row[0],
                row[1],
                [int(v or 0) for v in row[2 : 2 + n]],
                int(row[2 + n]),
                float(row[3 + n]),
            )
            for row in fetched
        )

    def _reclaims(self) -> Metric:
        family = CounterMetricFamily(
            "durable_reclaims",
            "Jobs taken back from a lost worker and queued again, by whether the attempt "
            "was spent (no unit committed) — among the jobs kept.",
            labels=["operation", "attempt_spent"],
        )
        rows = (
            JobEvent.objects.filter(kind="reclaimed")
            .order_by()
            .values_list("job__operation", "data__attempt_spent")
            .annotate(n=Count("*"))
        )
        counts: dict[tuple[str, str], int] = {}
        for operation, spent, n in rows:
            key = (operation, "true" if spent else "false")
            counts[key] = counts.get(key, 0) + n
        for (operation, spent), n in sorted(counts.items()):
            family.add_metric([operation, spent], n)
        return family

    def _workers(self, now: datetime) -> Iterator[Metric]:
        by_state = GaugeMetricFamily(
            "durable_workers",
            "Worker processes: live, unresponsive (stopped beating, not yet marked), "
            "stopped within the last hour.",
            labels=["state"],
        )
        per_queue = GaugeMetricFamily(
            "durable_queue_live_workers", "Live worker processes serving a queue.", labels=["queue"]
        )
        counts = dict.fromkeys(WORKER_STATES, 0)
        queues: dict[str, int] = {}
        rows = WorkerProcess.objects.filter(
            Q(stopped_at__isnull=True) | Q(stopped_at__gte=now - STOPPED_WITHIN)
        ).values_list("stopped_at", "heartbeat_at", "lease_seconds", "queues")
        for stopped_at, heartbeat_at, lease_seconds, served in rows:
            state = worker_state(
                stopped_at=stopped_at,
                heartbeat_at=heartbeat_at,
                lease_seconds=lease_seconds,
                now=now,
            )
            counts[state] += 1
            for queue in served or []:
                queues.setdefault(str(queue), 0)
                if state == "live":
                    queues[str(queue)] += 1
        for state, n in counts.items():
            by_state.add_metric([state], n)
        for queue, n in sorted(queues.items()):
            per_queue.add_metric([queue], n)
        yield by_state
        yield per_queue

    def _gates(self, now: datetime) -> Iterator[Metric]:
        from ..http.models import GateSlot

        family = GaugeMetricFamily(
            "durable_http_gate_slots_in_use",
            "Outbound HTTP concurrency-gate slots held now, per provider.",
            labels=["provider"],
        )
        rows = (
            GateSlot.objects.filter(expires_at__gt=now)
            .order_by()
            .values_list("provider")
            .annotate(n=Count("*"))
        )
        for provider, n in rows:
            family.add_metric([provider], n)
        yield family
