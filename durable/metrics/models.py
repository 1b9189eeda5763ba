"""The models of the running totals of GET /metrics live in ``durable.models.metrics``.

This module keeps the older import path working for code outside the engine;
the engine's own modules import ``durable.models``."""

from ..models.metrics import (
    FinishedTotal,
    HttpRetryTotal,
    MetricsCursor,
    ReclaimTotal,
    forget,
)

__all__ = [
    "FinishedTotal",
    "HttpRetryTotal",
    "MetricsCursor",
    "ReclaimTotal",
    "forget",
]
