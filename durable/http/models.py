"""The models of the outbound HTTP gates live in ``durable.models.http``.

This module keeps the older import path working for code outside the engine;
the engine's own modules import ``durable.models``."""

from ..models.http import (
    GateSlot,
    ProviderGate,
)

__all__ = [
    "GateSlot",
    "ProviderGate",
]
