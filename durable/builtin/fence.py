"""Fencing for the destructive steps of non-atomic operations.

A unit that deletes rows (a restore's or a copy's ``replace``) must never run
for a worker that lost its lease: a stalled worker waking up after another
one restored everything would delete it again, and fencing the checkpoint
afterwards would be too late. ``fenced`` opens a transaction on the job's
database that first checks — and, until commit, holds — the job's row for
this lease epoch; the destructive writes happen inside it. A reclaim has to
wait for that transaction, and a worker whose epoch is gone gets
``LeaseLost`` before it deletes anything.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import transaction

from ..errors import LeaseLost
from ..models import Job
from ..operations import JobContext
from ..states import LEASED_STATES


@contextmanager
def fenced(ctx: JobContext) -> Iterator[None]:
    with transaction.atomic():
        held = (
            Job.objects.select_for_update()
            .filter(
                pk=ctx.job_id,
                lease_owner=ctx.worker_id,
                lease_epoch=ctx.lease_epoch,
                state__in=LEASED_STATES,
            )
            .exists()
        )
        if not held:
            raise LeaseLost(f"job {ctx.job_id}: lease epoch {ctx.lease_epoch} is no longer ours")
        yield
