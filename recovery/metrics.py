"""Recovery's families for ``GET /metrics`` (registered with ``durable.metrics``).

Counted at scrape time, cheap at a million events: the events from the per-day counts
(``recovery.dashboard.listing.events_by_severity``), the refusals from their tallies.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Q, Sum
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from .dashboard.listing import events_by_severity
from .models import SecurityEvent, Severity


class RecoveryCollector:
    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        events = CounterMetricFamily(
            "recovery_events",
            "Recovery events kept, by severity and whether the recovery failed.",
            labels=["severity", "failed"],
        )
        # The per-day counts the Recovery report's totals read (a few hundred rows, not
        # a million). Every severity is listed, so that a rule on one never sees it absent.
        counts = events_by_severity()
        for severity in Severity.values:
            for failed in (False, True):
                n = counts.get((severity, failed), 0)
                events.add_metric([severity, "true" if failed else "false"], n)
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
