"""Webhook endpoints, deliveries and events: the models are in ``durable.models.webhooks``.

This module keeps the older import path working for code outside the engine;
the engine's own modules import ``durable.models``.
Migrations name ``durable.webhooks.models.validate_event_filter`` and
``validate_reference``: they must stay importable from here.
"""

from ..models.webhooks import (
    Delivery,
    DeliveryState,
    Endpoint,
    EventFilterMixin,
    OutboundEvent,
    validate_event_filter,
    validate_reference,
)

__all__ = [
    "Delivery",
    "DeliveryState",
    "Endpoint",
    "EventFilterMixin",
    "OutboundEvent",
    "validate_event_filter",
    "validate_reference",
]
