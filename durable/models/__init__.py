"""Every table of the engine, in the layer below everything else that touches the database.

Django discovers an app's models by importing ``durable.models``; this package
imports each module below, so every table is registered with the ``durable``
app (its migrations, its ``app_label``, its admin) from one place, and every
other part of the engine — jobs, the worker, the API, the built-in operations,
outbound HTTP — may import the models without importing each other. The models
import only the pure rule modules (``durable.rules``, ``durable.states``, the
``policy`` modules): never the code that writes them. See the architecture page
of the docs (docs/explanation/architecture.md).

- ``jobs``: ``Job``, its ``JobEvent`` log and ``UnitResult`` evidence;
- ``workers``: the ``WorkerProcess`` registry and ``PausedQueue``;
- ``clock``: the clock lease times are written with;
- ``api``: API clients and stored idempotent responses;
- ``http``: outbound HTTP gates; ``credentials``: the encrypted credential table;
- ``webhooks`` and ``mail``: published events, their destinations and deliveries;
- ``builtin``: what the built-in operations remember (announcements, inventories);
- ``metrics``: the running totals ``GET /metrics`` reads;
- ``schedules``: scheduled rules and their applied occurrences.

The older paths (``durable.api.models``, ``durable.webhooks.models``, …) still
import the same classes.
"""

from .api import Client, IdempotencyKey
from .builtin import Announcement, IntegrityScope, InventoryEntry, InventoryStatus
from .clock import database_now, db_now, in_callers_transaction
from .credentials import Credential
from .http import GateSlot, ProviderGate
from .jobs import Job, JobEvent, JobQuerySet, UnitResult
from .mail import MailDelivery, MailRecipient, MailState
from .metrics import FinishedTotal, HttpRetryTotal, MetricsCursor, ReclaimTotal
from .schedules import Occurrence, Schedule, ScheduleQuerySet
from .webhooks import Delivery, DeliveryState, Endpoint, EventFilterMixin, OutboundEvent
from .workers import PausedQueue, WorkerProcess, WorkerProcessQuerySet

__all__ = [
    "Announcement",
    "Client",
    "Credential",
    "Delivery",
    "DeliveryState",
    "Endpoint",
    "EventFilterMixin",
    "FinishedTotal",
    "GateSlot",
    "HttpRetryTotal",
    "IdempotencyKey",
    "IntegrityScope",
    "InventoryEntry",
    "InventoryStatus",
    "Job",
    "JobEvent",
    "JobQuerySet",
    "MailDelivery",
    "MailRecipient",
    "MailState",
    "MetricsCursor",
    "Occurrence",
    "OutboundEvent",
    "PausedQueue",
    "ProviderGate",
    "ReclaimTotal",
    "Schedule",
    "ScheduleQuerySet",
    "UnitResult",
    "WorkerProcess",
    "WorkerProcessQuerySet",
    "database_now",
    "db_now",
    "in_callers_transaction",
]
