"""Prometheus metrics read from the database at scrape time (``GET /metrics``).

Why from the database: every worker on every machine writes its jobs, leases and
heartbeats there, so one scrape of any web process tells the whole system, and a
restart or a second web process changes nothing. Nothing is counted in process memory.

Other apps add their own families without this package importing them: they call
``register_collector`` from their ``AppConfig.ready`` (recovery does, for its events).
See the how-to "Monitor it" in the docs for the families and alert rules.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.registry import Collector, CollectorRegistry

_extra: dict[str, Callable[[], Collector]] = {}


def register_collector(name: str, factory: Callable[[], Collector]) -> None:
    """Add a collector to every scrape; ``name`` makes a second registration a no-op."""
    _extra.setdefault(name, factory)


def build_registry() -> CollectorRegistry:
    """A fresh registry per scrape: the engine's collector and every registered one.

    Own registry, not prometheus_client's global one: no process metrics of whichever
    web process answered, only what the database says.
    """
    from .collector import DurableCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(DurableCollector())
    for factory in _extra.values():
        registry.register(factory())
    return registry
