"""Every worker ticks the schedules: once when it starts, then on each heartbeat.

There is no scheduler process to keep alive or to elect: any worker that is
running applies what is due, and the database decides which one does (see
``service.apply_due``). A heartbeat comes about every ``lease_seconds / 3``
(10 s by default), so an occurrence is applied up to that late.
"""

from __future__ import annotations

import logging
from typing import Any

from .. import signals
from .service import tick

log = logging.getLogger("durable.schedules")


def on_worker_started(sender: Any, *, worker_id: str = "", **kwargs: Any) -> None:
    tick(worker=worker_id)


def on_worker_heartbeat(sender: Any, *, worker_id: str = "", **kwargs: Any) -> None:
    tick(worker=worker_id)


def connect() -> None:
    """Called from ``DurableConfig.ready()``; ``dispatch_uid`` makes repeats harmless."""
    signals.worker_started.connect(on_worker_started, dispatch_uid="durable.schedules.started")
    signals.worker_heartbeat.connect(
        on_worker_heartbeat, dispatch_uid="durable.schedules.heartbeat"
    )
