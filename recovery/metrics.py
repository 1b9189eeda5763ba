"""Recovery's families for ``GET /metrics`` (registered with ``durable.metrics``).

Counted at scrape time, cheap at a million events: the events from the per-day counts
(``recovery.dashboard.listing.recovery_totals``), the refusals from their tallies.
"""

from __future__ import annotations

from collections.abc import Iterator

from django.db.models import Q, Sum
from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from .dashboard.listing import recovery_totals
from .models import SecurityEvent


class RecoveryCollector:
    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        events = CounterMetricFamily(
            "recovery_events",
            "Recovery events kept, by whether the recovery failed.",
            labels=["failed"],
        )
        # The per-day counts the Recovery report's totals read (a few hundred rows, not
        # a million). Not split by severity: that has no count of its own yet, and
        # counting it from the events costs ~300 ms at a million on SQLite.
        totals = recovery_totals()
        events.add_metric(["true"], totals["failed"])
        events.add_metric(["false"], totals["done"])
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
