"""Queues as operators see them: pause and resume claiming, per queue.

A paused queue keeps its jobs and accepts new ones; workers simply do not claim
from it (one condition of the claim, ``durable.lease.pick_sql``). Jobs already
running are not touched: each finishes its current unit and goes on, as a job paused
by hand would not — pausing a queue stops *starts*, and an operator who wants running
work to stop pauses those jobs too. Both calls are idempotent and say whether they
changed anything, so a double click is reported as "already so".
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from .models import PausedQueue
from .rules import queue_name_problem


def pause_queue(queue: str, *, actor: str = "", reason: str = "") -> bool:
    """Stop claims from ``queue``; False if it was already paused.

    ValueError for a name no job can have (``durable.rules``): the same names
    ``enqueue()`` and the HTTP API refuse.
    """
    problem = queue_name_problem(queue)
    if problem is not None:
        raise ValueError(f"queue {str(queue)[:40]!r} {problem}")
    try:
        with transaction.atomic():
            PausedQueue.objects.create(
                queue=queue, paused_at=timezone.now(), paused_by=actor[:150], reason=reason[:500]
            )
    except IntegrityError:
        return False
    return True


def resume_queue(queue: str) -> bool:
    """Let workers claim from ``queue`` again; False if it was not paused."""
    deleted, _ = PausedQueue.objects.filter(queue=queue).delete()
    return bool(deleted)


def paused_queues() -> dict[str, PausedQueue]:
    """Every paused queue by name, with who paused it, when and why."""
    return {row.queue: row for row in PausedQueue.objects.all()}
