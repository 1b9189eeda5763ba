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

from .models import Job, PausedQueue

MAX_QUEUE_CHARS = Job._meta.get_field("queue").max_length


def pause_queue(queue: str, *, actor: str = "", reason: str = "") -> bool:
    """Stop claims from ``queue``; False if it was already paused."""
    if not queue or len(queue) > MAX_QUEUE_CHARS:
        raise ValueError(f"a queue name has 1 to {MAX_QUEUE_CHARS} characters")
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
    return {row.queue: row for row in PausedQueue.objects.all()}
