"""The models of the built-in operations' tables live in ``durable.models.builtin``.

This module keeps the older import path working for code outside the engine;
the engine's own modules import ``durable.models``."""

from ..models.builtin import (
    Announcement,
    IntegrityScope,
    InventoryEntry,
    InventoryStatus,
)

__all__ = [
    "Announcement",
    "IntegrityScope",
    "InventoryEntry",
    "InventoryStatus",
]
