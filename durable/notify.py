"""Publish events to webhooks and mail: one delivery record and one job per destination.

``publish(event_type, event_id, payload)`` is the public entry point. It
stores the event once (``event_id`` is unique: publishing the same event
twice creates nothing new), creates one delivery record for every enabled
webhook endpoint and mail recipient whose filter matches, and enqueues one
durable job per record, all in one transaction. Each delivery then retries,
backs off and fails on its own, so one dead receiver never delays the others.

The engine's own problems are published here too (``connect_receivers``):
a job that needs a person (``job.failed`` / ``job.paused``) and a recovery
event of severity ``error`` (``recovery.<type>``). The delivery operations'
own failures are not published again — a dead receiver must not feed a
loop of notifications about failed notifications.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, QuerySet
from django.http import HttpRequest
from django.utils import timezone

from . import signals
from .errors import InputRejected, LeaseLost
from .jobs import enqueue, retry_now
from .mail.policy import message_id
from .models import Delivery, Endpoint, Job, MailDelivery, MailRecipient, OutboundEvent
from .operations import JobContext
from .policy import redact, truncate_utf8
from .states import LEASED_STATES, JobState
from .webhooks.policy import content_id, idempotency_key

log = logging.getLogger("durable.notify")

WEBHOOK_OPERATION = "durable.webhook"
MAIL_OPERATION = "durable.mail"
NOTIFY_OPERATIONS = frozenset({WEBHOOK_OPERATION, MAIL_OPERATION})
MAX_PAYLOAD_BYTES = 64 * 1024
MAX_LAST_ERROR_BYTES = 1000
# A webhook's or a mail's delivery record: the same bookkeeping fields on both.
DeliveryModel = type[Delivery] | type[MailDelivery]


@dataclass
class Published:
    event_id: str
    created: bool
    webhook_deliveries: list[int] = field(default_factory=list)  # created by this call
    mail_deliveries: list[int] = field(default_factory=list)


def _check_payload(payload: Any) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise InputRejected("payload", "must be a JSON object")
    try:
        text = json.dumps(payload, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InputRejected("payload", f"is not JSON: {exc}") from None
    if len(text.encode("utf-8")) > MAX_PAYLOAD_BYTES:
        raise InputRejected("payload", f"is over {MAX_PAYLOAD_BYTES} bytes")
    return json.loads(text)


def publish(
    event_type: str, event_id: str, payload: dict[str, Any], *, summary: str = ""
) -> Published:
    """Fan an event out to every matching destination; idempotent per ``event_id``."""
    if not event_type or len(event_type) > 100:
        raise InputRejected("event_type", "must be 1 to 100 characters")
    if not event_id or len(event_id) > 200:
        raise InputRejected("event_id", "must be 1 to 200 characters")
    data = _check_payload(payload)
    summary = truncate_utf8(" ".join((summary or "").split()), 300)
    endpoints = list(Endpoint.objects.filter(enabled=True).order_by("pk"))
    recipients = list(MailRecipient.objects.filter(enabled=True).order_by("pk"))
    with transaction.atomic():
        event = OutboundEvent.objects.filter(event_id=event_id).first()
        wanted_type = event.event_type if event else event_type
        endpoints = [e for e in endpoints if e.matches(wanted_type)]
        recipients = [r for r in recipients if r.matches(wanted_type)]
        if event is None and not (endpoints or recipients):
            # Nobody listens: store nothing, so an unconfigured site keeps no event log.
            return Published(event_id, created=False)
        event, created = OutboundEvent.objects.get_or_create(
            event_id=event_id,
            defaults={"event_type": event_type, "summary": summary, "payload": data},
        )
        result = Published(event_id, created)
        for endpoint in endpoints:
            delivery, new = Delivery.objects.get_or_create(
                event=event,
                endpoint=endpoint,
                defaults={"idempotency_key": idempotency_key(event_id, f"hook:{endpoint.pk}")},
            )
            if new:
                job = _enqueue(WEBHOOK_OPERATION, delivery.pk, "webhook-delivery")
                Delivery.objects.filter(pk=delivery.pk).update(job_id=job.pk)
                result.webhook_deliveries.append(delivery.pk)
        for recipient in recipients:
            mail, new = MailDelivery.objects.get_or_create(
                event=event,
                recipient=recipient,
                defaults={
                    "address": recipient.email,
                    "message_id": message_id(event_id, recipient.pk, sender_address()),
                },
            )
            if new:
                job = _enqueue(MAIL_OPERATION, mail.pk, "mail-delivery")
                MailDelivery.objects.filter(pk=mail.pk).update(job_id=job.pk)
                result.mail_deliveries.append(mail.pk)
    return result


def anyone_listening() -> bool:
    """True if any enabled webhook endpoint or mail recipient exists (two tiny queries).

    Lets a bulk caller skip building payloads on a site that configured no destination.
    """

    return (
        Endpoint.objects.filter(enabled=True).exists()
        or MailRecipient.objects.filter(enabled=True).exists()
    )


def sender_address() -> str:
    return getattr(settings, "DURABLE_MAIL_FROM", "") or settings.DEFAULT_FROM_EMAIL


def _enqueue(operation: str, delivery_id: int, prefix: str, owner: str = "notify") -> Job:
    return enqueue(
        operation,
        {"delivery_id": delivery_id},
        owner=owner,
        unique_key=f"{prefix}:{delivery_id}",
    )


def _again(
    model: DeliveryModel, operation: str, prefix: str, pk: int, actor: str, counter: str
) -> Job:
    """Shared by redeliver/resend: back to pending, same key, job enqueued or woken."""
    with transaction.atomic():
        record = model.objects.select_for_update().get(pk=pk)
        job = _enqueue(operation, record.pk, prefix, owner=actor or "operator")
        if not job.created:
            retry_now(job.pk, actor=actor)  # waiting in a backoff, paused or failed: now
        model.objects.filter(pk=pk).update(
            state="pending",
            job_id=job.pk,
            last_error="",
            updated_at=timezone.now(),
            **{counter: F(counter) + 1},
        )
    return job


def audit_actor(request: HttpRequest) -> str:
    """How a person acting through the admin is named in the jobs' event logs."""
    return f"admin:{request.user.get_username()}"[:150]


def redeliver(delivery_id: int, *, actor: str = "") -> Job:
    """Send a webhook delivery again (an operator's request) with the same idempotency key."""
    return _again(
        Delivery, WEBHOOK_OPERATION, "webhook-delivery", delivery_id, actor, "redeliveries"
    )


def resend_mail(delivery_id: int, *, actor: str = "") -> Job:
    """Send a mail delivery again (an operator's request), same Message-ID."""
    return _again(MailDelivery, MAIL_OPERATION, "mail-delivery", delivery_id, actor, "resends")


# --- writes from inside a delivery unit ---------------------------------------------


def fenced_update(ctx: JobContext, queryset: QuerySet, **fields: Any) -> None:
    """Update delivery rows only while this worker still holds the job's lease.

    A stalled worker whose job was taken back must not overwrite what the new
    holder recorded (e.g. turn "delivered" back into "pending").
    """
    with transaction.atomic():
        held = list(
            Job.objects.select_for_update()
            .filter(
                pk=ctx.job_id,
                lease_owner=ctx.worker_id,
                lease_epoch=ctx.lease_epoch,
                state__in=LEASED_STATES,
            )
            .values_list("pk", flat=True)[:1]
        )
        if not held:
            raise LeaseLost(f"job {ctx.job_id}: lease epoch {ctx.lease_epoch} lost")
        queryset.update(updated_at=timezone.now(), **fields)


def last_error(text: str, secrets: Iterable[str] = ()) -> str:
    return truncate_utf8(redact(text, frozenset(secrets)), MAX_LAST_ERROR_BYTES)


def max_attempts(job_id: int) -> int:
    return Job.objects.filter(pk=job_id).values_list("max_attempts", flat=True).first() or 1


# --- what the engine reports -----------------------------------------------------------


def _delivery_model(operation: str) -> DeliveryModel | None:
    if operation == WEBHOOK_OPERATION:
        return Delivery
    if operation == MAIL_OPERATION:
        return MailDelivery
    return None


def _settle_delivery(job_id: int, operation: str, state: str, reason: str) -> None:
    """A delivery job ended outside its unit (exhausted by worker crashes, cancelled).

    The new state replaces ``sending`` (mail) too, but not the doubt it stood for:
    such a record keeps ``possibly_sent``, and a webhook record keeps the
    ``possibly_sent`` its unit set before posting.
    """
    model = _delivery_model(operation)
    job_input = Job.objects.filter(pk=job_id).values_list("input", flat=True).first() or {}
    if model is None or "delivery_id" not in job_input:
        return
    done = ("delivered", "sent")
    rows = model.objects.filter(pk=job_input["delivery_id"], job_id=job_id).exclude(state__in=done)
    now = timezone.now()
    with transaction.atomic():
        rows.filter(state="sending").update(possibly_sent=True)
        doubt = rows.filter(possibly_sent=True).exists()
        if doubt:
            reason = f"{reason} (it may have been sent: an attempt never recorded its outcome)"
        rows.update(state=state, last_error=last_error(reason), updated_at=now)


MAX_CHECKPOINT_CHARS = 8 * 1024


def _bounded_json(value: Any) -> Any:
    """A checkpoint as it is, unless it is large: then its beginning, as text."""
    text = json.dumps(value, default=str)
    if len(text) <= MAX_CHECKPOINT_CHARS:
        return json.loads(text)
    return {"truncated": text[:MAX_CHECKPOINT_CHARS]}


def on_job_needs_attention(sender: object, **kwargs: Any) -> None:
    job_id, operation, state = kwargs["job_id"], kwargs["operation"], kwargs["state"]
    if operation in NOTIFY_OPERATIONS:
        if kwargs.get("cause") == "exhausted":
            _settle_delivery(job_id, operation, "exhausted", kwargs.get("reason", ""))
        return
    seq = Job.objects.filter(pk=job_id).values_list("event_seq", flat=True).first()
    reason = truncate_utf8(kwargs.get("reason") or "", 2000)
    next_at = kwargs.get("next_attempt_at")
    publish(
        f"job.{state}",
        f"job:{job_id}:{seq}",
        {
            "job_id": job_id,
            "operation": operation,
            "state": state,
            "cause": kwargs.get("cause", ""),
            "reason": reason,
            "checkpoint": _bounded_json(kwargs.get("checkpoint")),
            "attempt": kwargs.get("attempt"),
            "next_attempt_at": next_at.isoformat() if next_at else None,
        },
        summary=f"{operation} job {job_id} {state}: {reason}",
    )


RECOVERY_FIELDS = ("type", "severity", "detail", "db", "source", "done", "deleted_data", "job_id",
                   "operation", "checkpoint", "attempt", "object_ids", "object_titles")  # fmt: skip


def on_recovery_event(sender: object, **kwargs: Any) -> None:
    if kwargs.get("severity") != "error" or not kwargs.get("type"):
        return
    data = {name: kwargs.get(name) for name in RECOVERY_FIELDS if kwargs.get(name) is not None}
    data["detail"] = truncate_utf8(str(data.get("detail", "")), 4000)
    publish(
        truncate_utf8(f"recovery.{kwargs['type']}", 100),
        f"recovery:{content_id(data)}",
        json.loads(json.dumps(data, default=str)),
        summary=f"{kwargs['type']}: {data['detail']}",
    )


def on_job_state_changed(sender: object, **kwargs: Any) -> None:
    if kwargs.get("operation") in NOTIFY_OPERATIONS and kwargs.get("new_state") == (
        JobState.CANCELLED
    ):
        _settle_delivery(kwargs["job_id"], kwargs["operation"], "cancelled", "job cancelled")


def connect_receivers() -> None:
    """Called from ``DurableConfig.ready``; ``DURABLE_NOTIFY_ENGINE_EVENTS = False`` turns off
    publishing the engine's problems (delivery bookkeeping stays connected)."""
    signals.job_state_changed.connect(on_job_state_changed, dispatch_uid="durable.notify.state")
    if not getattr(settings, "DURABLE_NOTIFY_ENGINE_EVENTS", True):
        return
    signals.job_needs_attention.connect(on_job_needs_attention, dispatch_uid="durable.notify.job")
    signals.recovery_event.connect(on_recovery_event, dispatch_uid="durable.notify.recovery")
