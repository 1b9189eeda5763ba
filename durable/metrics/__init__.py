"""Prometheus metrics read from the database at scrape time (``GET /metrics``).

Why from the database: every worker on every machine writes its jobs, leases and
heartbeats there, so one scrape of any web process tells the whole system, and a
restart or a second web process changes nothing. Nothing is counted in process memory.

Other apps add their own families without this package importing them: they call
``register_collector`` from their ``AppConfig.ready`` (recovery does, for its events).
See the how-to "Monitor it" in the docs for the families and alert rules.

Layout: this module holds only that registry, so registering imports nothing;
``totals`` keeps the settled running totals, ``collector`` reads the engine's
tables at scrape time (``build_registry``), ``views`` serves ``GET /metrics``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # registering imports nothing: prometheus_client loads with the collector
    from prometheus_client.registry import Collector

_extra: dict[str, Callable[[], Collector]] = {}


def register_collector(name: str, factory: Callable[[], Collector]) -> None:
    """Add a collector to every scrape; ``name`` makes a second registration a no-op."""
    _extra.setdefault(name, factory)


def registered_collectors() -> list[Callable[[], Collector]]:
    """The factories other apps registered, in registration order."""
    return list(_extra.values())
