"""The models of API clients and stored idempotent responses live in ``durable.models.api``.

This module keeps the older import path working for code outside the engine;
the engine's own modules import ``durable.models``."""

from ..models.api import (
    ADMIN_SCOPE,
    METRICS_SCOPE,
    SCOPE_HELP,
    SCOPES,
    Client,
    IdempotencyKey,
    IdempotencyKeyQuerySet,
)

__all__ = [
    "ADMIN_SCOPE",
    "METRICS_SCOPE",
    "SCOPES",
    "SCOPE_HELP",
    "Client",
    "IdempotencyKey",
    "IdempotencyKeyQuerySet",
]
