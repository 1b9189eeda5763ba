"""Recovery's families for ``GET /metrics`` (registered with ``durable.metrics``).

Counted at scrape time from the tables, cheap at a million events: the failed and
severe events through their small partial indexes, the rest by difference from one
count of the whole table.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Count, Q, Sum
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from .models import RecoveryEvent, SecurityEvent, Severity

SEVERE = (Severity.WARNING, Severity.ERROR)


def event_counts(
    total: int, failed: int, severe: dict[tuple[str, bool], int]
) -> dict[tuple[str, bool], int]:
    """(severity, failed) → events, from the table's total, its failed count and the
    severe (warning, error) events split by failed; info is what is left. Pure."""
    out = {(str(s), f): severe.get((str(s), f), 0) for s in SEVERE for f in (True, False)}
    severe_failed = sum(n for (_, f), n in out.items() if f)
    severe_done = sum(n for (_, f), n in out.items() if not f)
    out[(str(Severity.INFO), True)] = max(failed - severe_failed, 0)
    out[(str(Severity.INFO), False)] = max(total - failed - severe_done, 0)
    return out


class RecoveryCollector:
    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        events = CounterMetricFamily(
            "recovery_events",
            "Recovery events kept, by severity and whether the recovery failed.",
            labels=["severity", "failed"],
        )
        rows = RecoveryEvent.objects.order_by()
        total = rows.count()
        failed = rows.filter(done=False).count()
        severe = {
            (severity, done is False): n
            for severity, done, n in rows.filter(severity__in=SEVERE)
            .values_list("severity", "done")
            .annotate(n=Count("*"))
        }
        for (severity, is_failed), n in sorted(event_counts(total, failed, severe).items()):
            events.add_metric([severity, "true" if is_failed else "false"], n)
        yield events
        refusals = CounterMetricFamily(
            "durable_security_refusals",
            "Refusals recorded under Problems → Security (bad tokens, SSRF, ...), by category.",
            labels=["category"],
        )
        tallies = (
            SecurityEvent.objects.order_by()
            .filter(~Q(category=""))
            .values_list("category")
            .annotate(n=Sum("count"))
        )
        for category, n in tallies:
            refusals.add_metric([category], n or 0)
        yield refusals
