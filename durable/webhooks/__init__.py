"""Webhook endpoints and deliveries. ``publish`` and ``redeliver`` live in ``durable.notify``."""

from __future__ import annotations

from typing import Any


def publish(event_type: str, event_id: str, payload: dict[str, Any], *, summary: str = "") -> Any:
    """Fan an event out to every matching endpoint and mail recipient (durable.notify)."""
    from ..notify import publish as _publish

    return _publish(event_type, event_id, payload, summary=summary)


def redeliver(delivery_id: int, *, actor: str = "") -> Any:
    """Send a delivery again with the same idempotency key (see durable.notify)."""
    from ..notify import redeliver as _redeliver

    return _redeliver(delivery_id, actor=actor)
