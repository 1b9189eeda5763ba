"""Recovery events from built-in operations: recorded exactly once per job and fact.

A unit's side effect (a published backup, a restored table) is not in the
transaction that advances the checkpoint, so a crash in between repeats the
unit. The event must not repeat with it, and must not be lost either.
``announce`` is an outbox: in **one transaction** it inserts an
``Announcement`` row keyed by (job, key) and sends ``recovery_event`` to
the receivers, which write their rows (the ``RecoveryEvent``, the
notification deliveries) in that same transaction. Either both commit or
neither does: a unit killed before the commit sends it when it runs again,
one killed after it finds the row and stays silent. There is no moment
between "marked as sent" and "sent" for a crash to fall into.

Receivers therefore run inside the announcing transaction and must only
write to the database (no network). A receiver's database error rolls the
announcement back and fails the unit, which is retried; any other error is
logged and does not stop the others, as with ``send_robust``.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction

from .. import faults, signals
from ..models.builtin import Announcement
from ..operations import JobContext
from ..policy import truncate_utf8

MAX_DETAIL_BYTES = 2048
MAX_OBJECTS = 50

log = logging.getLogger("durable.builtin.announce")


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


def send_in_transaction(**kwargs: Any) -> None:
    """Send ``recovery_event`` now, inside the caller's transaction (a savepoint of its own).

    A receiver that hit a database error may have left the transaction unusable
    (PostgreSQL refuses every later statement): its error is raised, which rolls
    the savepoint back and the announcement with it, instead of committing a
    marker whose event never got written.
    """
    with transaction.atomic():
        results = signals.recovery_event.send_robust(sender="durable", must_record=True, **kwargs)
        for receiver, result in results:
            if isinstance(result, DatabaseError):
                raise result
            if isinstance(result, Exception):
                log.error(
                    "recovery_event receiver failed",
                    extra={"receiver": getattr(receiver, "__qualname__", repr(receiver))},
                    exc_info=result,
                )


def announce(ctx: JobContext, key: str, type: str, **fields: Any) -> bool:
    """Record a recovery event unless this job already did for ``key``; True if it is done now.

    Inside a caller's transaction the marker and the event commit (or roll
    back) with the caller's writes — e.g. an inventory update that proves
    the finding.
    """
    kwargs = event_kwargs(ctx, type, **fields)
    with transaction.atomic():
        try:
            _, created = Announcement.objects.get_or_create(job_id=ctx.job_id, key=key[:200])
        except IntegrityError:
            return False  # a concurrent insert of the same key: that one records it
        if created:
            # A receiver's IntegrityError is raised from here, not taken for the race.
            send_in_transaction(**kwargs)
            # Crash tests: the event is written, its transaction not yet committed.
            faults.reach("announce.before_commit")
    if created:
        # Crash tests: marker and event are written (committed, unless the caller's
        # transaction is still open); the unit's checkpoint has not advanced.
        faults.reach("announced")
    return created
