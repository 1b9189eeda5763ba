"""Retention as a durable operation: ``durable.purge``."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from ..errors import InputRejected
from ..models import (
    Delivery,
    DeliveryState,
    IdempotencyKey,
    Job,
    MailDelivery,
    MailState,
    Occurrence,
    OutboundEvent,
    WorkerProcess,
)
from ..operations import Access, JobContext, Operation, Unit, register
from ..policy import parse_duration
from ..states import UNFINISHED_STATES

PURGE_BATCH = 200


def purgeable_outbound(cutoff: datetime) -> QuerySet[OutboundEvent]:
    """Published events older than ``cutoff`` whose every delivery is settled.

    A delivery still pending (or a mail still "sending"), or whose job is
    unfinished — an exhausted delivery's job may be paused, and resuming it
    needs its record — keeps its event and all its deliveries.
    """
    live_job = Job.objects.filter(pk=OuterRef("job_id"), state__in=UNFINISHED_STATES)
    hooks = Delivery.objects.filter(event=OuterRef("pk")).filter(
        Q(state=DeliveryState.PENDING) | Q(Exists(live_job))
    )
    mails = MailDelivery.objects.filter(event=OuterRef("pk")).filter(
        Q(state__in=[MailState.PENDING, MailState.SENDING]) | Q(Exists(live_job))
    )
    return (
        OutboundEvent.objects.filter(created_at__lt=cutoff)
        .exclude(Exists(hooks))
        .exclude(Exists(mails))
    )


@register
class PurgeJobs(Operation):
    """Delete finished jobs (with their events and unit results) older than a cut-off,
    then the API's idempotency keys older than it, then schedule occurrence
    records and stopped workers' records.

    Unit = one batch of job (or key) ids in id order; the checkpoint is the
    cut-off and the last id examined. Units only delete rows of this database,
    so they run atomically with the checkpoint: a crash never deletes a batch
    twice or skips one. Unfinished jobs are never selected, and inside the
    unit's transaction the batch is locked and checked again before anything
    is deleted, so a job an operator retried meanwhile is kept. An idempotency
    key whose job is unfinished is kept: a client retrying that submission must
    get the same job back, not a second one.
    """

    name = "durable.purge"
    label = "Purge finished jobs"
    atomic_units = True
    max_attempts = 3
    access = Access.PRIVILEGED  # deletes other people's jobs and records

    def clean_input(self, data: dict[str, Any]) -> dict[str, Any]:
        try:
            age = parse_duration(str(data.get("older_than", "30d")))
        except ValueError as exc:
            raise InputRejected("older_than", str(exc)) from None
        if age < timedelta(minutes=1):
            raise InputRejected("older_than", "must be at least 1m")
        return {"older_than": str(data.get("older_than", "30d")).strip()}

    def _cutoff(self, ctx: JobContext) -> datetime:
        if ctx.checkpoint and ctx.checkpoint.get("cutoff"):
            return datetime.fromisoformat(ctx.checkpoint["cutoff"])  # written by isoformat()
        return timezone.now() - parse_duration(ctx.input["older_than"])

    def total_units(self, ctx: JobContext) -> int | None:
        cutoff = self._cutoff(ctx)
        jobs = Job.objects.purgeable(cutoff).count()
        keys = IdempotencyKey.objects.purgeable(cutoff).count()
        sent = purgeable_outbound(cutoff).count()
        # job, key and notification batches, then the occurrence and worker-registry units
        return -(-jobs // PURGE_BATCH) + -(-keys // PURGE_BATCH) + -(-sent // PURGE_BATCH) + 2

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        cutoff = self._cutoff(ctx)
        after = (ctx.checkpoint or {}).get("after_id", 0)
        keys_after = (ctx.checkpoint or {}).get("keys_after_id", 0)
        while True:
            ids = list(
                Job.objects.purgeable(cutoff)
                .filter(pk__gt=after)
                .order_by("pk")
                .values_list("pk", flat=True)[:PURGE_BATCH]
            )
            if not ids:
                break
            after = ids[-1]
            yield Unit(
                key=f"jobs:{ids[0]}-{ids[-1]}",
                payload={"ids": ids, "cutoff": cutoff.isoformat()},
                checkpoint={"cutoff": cutoff.isoformat(), "after_id": after},
            )
        while True:
            ids = list(
                IdempotencyKey.objects.purgeable(cutoff)
                .filter(pk__gt=keys_after)
                .order_by("pk")
                .values_list("pk", flat=True)[:PURGE_BATCH]
            )
            if not ids:
                break
            keys_after = ids[-1]
            yield Unit(
                key=f"idempotency-keys:{ids[0]}-{ids[-1]}",
                payload={"key_ids": ids, "cutoff": cutoff.isoformat()},
                checkpoint={
                    "cutoff": cutoff.isoformat(),
                    "after_id": after,
                    "keys_after_id": keys_after,
                },
            )
        sent_after = (ctx.checkpoint or {}).get("sent_after_id", 0)
        while True:
            ids = list(
                purgeable_outbound(cutoff)
                .filter(pk__gt=sent_after)
                .order_by("pk")
                .values_list("pk", flat=True)[:PURGE_BATCH]
            )
            if not ids:
                break
            sent_after = ids[-1]
            yield Unit(
                key=f"outbound-events:{ids[0]}-{ids[-1]}",
                payload={"event_ids": ids, "cutoff": cutoff.isoformat()},
                checkpoint={
                    "cutoff": cutoff.isoformat(),
                    "after_id": after,
                    "keys_after_id": keys_after,
                    "sent_after_id": sent_after,
                },
            )
        # A schedule never needs its old occurrence records: only occurrences
        # after its next_run_at are ever applied (see durable.schedules).
        yield Unit(
            key="schedule-occurrences",
            payload={"cutoff": cutoff.isoformat()},
            checkpoint={
                "cutoff": cutoff.isoformat(),
                "after_id": after,
                "keys_after_id": keys_after,
                "sent_after_id": sent_after,
                "occurrences": True,
            },
        )
        yield Unit(
            key="workers",
            payload={"cutoff": cutoff.isoformat()},
            checkpoint={
                "cutoff": cutoff.isoformat(),
                "after_id": after,
                "keys_after_id": keys_after,
                "sent_after_id": sent_after,
                "workers": True,
            },
        )

    def run_unit(self, ctx: JobContext, unit: Unit) -> dict[str, int]:
        cutoff = datetime.fromisoformat(unit.payload["cutoff"])
        if unit.key == "schedule-occurrences":
            deleted, _ = Occurrence.objects.filter(created_at__lt=cutoff).delete()
            return {"occurrences": deleted}
        if unit.key == "workers":
            deleted, _ = WorkerProcess.objects.filter(stopped_at__lt=cutoff).delete()
            return {"workers": deleted}
        if "event_ids" in unit.payload:
            return self._purge_outbound(cutoff, unit.payload["event_ids"])
        if "key_ids" in unit.payload:
            keys = IdempotencyKey.objects.purgeable(cutoff).filter(pk__in=unit.payload["key_ids"])
            deleted, _ = keys.delete()
            return {"idempotency_keys": deleted}
        # Lock the batch, then delete only what is still finished and old. Django's
        # delete() selects, collects related rows, then deletes by id alone: an
        # operator's "retry now" committed in between would otherwise lose the
        # job it just made unfinished. Locked here (PostgreSQL waits for an action
        # in progress and re-checks the state; SQLite's write lock serialises
        # anyway), the rows cannot change before this transaction commits.
        ids = list(
            Job.objects.purgeable(cutoff)
            .filter(pk__in=unit.payload["ids"])
            .select_for_update()
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        _, per_model = Job.objects.filter(pk__in=ids).delete()
        return {
            "jobs": per_model.get("durable.Job", 0),
            "events": per_model.get("durable.JobEvent", 0),
            # Keys of these jobs go with them (ON DELETE CASCADE).
            "idempotency_keys": per_model.get("durable.IdempotencyKey", 0),
        }

    def _purge_outbound(self, cutoff: datetime, ids: list[int]) -> dict[str, int]:
        # Checked again here: a redelivery may have started since the unit was planned.
        events = list(purgeable_outbound(cutoff).filter(pk__in=ids).values_list("pk", flat=True))
        hooks, _ = Delivery.objects.filter(event_id__in=events).delete()
        mails, _ = MailDelivery.objects.filter(event_id__in=events).delete()
        sent, _ = OutboundEvent.objects.filter(pk__in=events).delete()
        return {"outbound_events": sent, "webhook_deliveries": hooks, "mail_deliveries": mails}
