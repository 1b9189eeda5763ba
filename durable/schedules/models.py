"""The models of scheduled rules and their occurrences live in ``durable.models.schedules``.

This module keeps the older import path working for code outside the engine;
the engine's own modules import ``durable.models``."""

from ..models.schedules import (
    Occurrence,
    Schedule,
    ScheduleQuerySet,
)

__all__ = [
    "Occurrence",
    "Schedule",
    "ScheduleQuerySet",
]
