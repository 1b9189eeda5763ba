"""Recovery events from built-in operations, sent once per job and fact.

A unit's side effect (a published backup, a restored table) is not in the
transaction that advances the checkpoint, so a crash in between repeats the
unit. The event must not repeat with it: ``announce`` inserts an
``Announcement`` row keyed by (job, key) and sends the signal on commit of
that same transaction. A repeated unit finds the row and stays silent; a
unit that crashed before the commit sends it when it runs again.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from .. import faults, signals
from ..operations import JobContext
from ..policy import truncate_utf8
from .models import Announcement

MAX_DETAIL_BYTES = 2048
MAX_OBJECTS = 50


def event_kwargs(ctx: JobContext, type: str, **fields: Any) -> dict[str, Any]:
    """The ``recovery_event`` keyword arguments for a fact this job established."""
    kwargs = {
        "type": type,
        "severity": fields.pop("severity", "info"),
        "detail": truncate_utf8(str(fields.pop("detail", "")), MAX_DETAIL_BYTES),
        "db": fields.pop("db", ""),
        "source": "worker",
        "done": fields.pop("done", True),
        "deleted_data": fields.pop("deleted_data", False),
        "job_id": ctx.job_id,
        "operation": ctx.operation,
        "checkpoint": ctx.checkpoint,
        "attempt": ctx.attempt,
        "object_ids": [str(x) for x in fields.pop("object_ids", [])][:MAX_OBJECTS],
        "object_titles": [str(x) for x in fields.pop("object_titles", [])][:MAX_OBJECTS],
    }
    if fields:
        raise TypeError(f"unknown recovery event fields: {sorted(fields)}")
    return kwargs


def announce(ctx: JobContext, key: str, type: str, **fields: Any) -> bool:
    """Send a recovery event unless this job already sent ``key``; True if it is sent now.

    Inside a caller's transaction the marker and the send commit (or roll
    back) with the caller's writes — e.g. an inventory update that proves
    the finding.
    """
    kwargs = event_kwargs(ctx, type, **fields)
    try:
        with transaction.atomic():
            _, created = Announcement.objects.get_or_create(job_id=ctx.job_id, key=key[:200])
            if created:
                signals.send_on_commit(signals.recovery_event, **kwargs)
                # Crash tests: the event is out, the unit's checkpoint not yet advanced.
                transaction.on_commit(lambda: faults.reach("announced"))
    except IntegrityError:
        return False  # a concurrent insert of the same key: that one sends it
    return created
