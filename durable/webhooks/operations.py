"""``durable.webhook``: POST one delivery's event to its endpoint, signed, idempotency-keyed.

One job per delivery, one unit per job. The unit skips a delivery already
recorded as delivered; otherwise it POSTs through ``durable.http`` (timeouts,
bounded body, gates, SSRF guard) and records the outcome on the delivery,
fenced by the job's lease. A crash after the POST but before that record
repeats the POST with the *same* ``Idempotency-Key``, which is what the
receiver deduplicates on.

Before the first POST the record is marked ``possibly_sent`` in its own
commit; an answer from the receiver, or a failure that certainly sent
nothing (gate closed, connect error, SSRF refusal, a missing credential),
puts back what it was. So a worker killed after the POST, or a timeout after
the body went out, leaves the doubt on the record — and cancelling or
exhausting the job later does not erase it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from django.utils import timezone

from .. import faults, http, notify
from ..errors import InputRejected, NonRetryable
from ..http.errors import HttpError, HttpRetryLater
from ..models.webhooks import Delivery, DeliveryState
from ..operations import Access, JobContext, Operation, Unit, register
from ..states import JobState
from . import policy


def _delivery(ctx: JobContext) -> Delivery:
    try:
        return Delivery.objects.select_related("endpoint", "event").get(pk=ctx.input["delivery_id"])
    except Delivery.DoesNotExist:
        raise NonRetryable(
            f"webhook delivery {ctx.input['delivery_id']} no longer exists"
        ) from None


@register
class DeliverWebhook(Operation):
    name = notify.WEBHOOK_OPERATION
    label = "Deliver a webhook"
    description = "POST one event to one endpoint; retried with backoff, signed, idempotent."
    max_attempts = 10
    on_exhausted = JobState.FAILED
    unit_timeout = 600.0
    access = Access.SYSTEM  # ``publish`` and ``redeliver`` enqueue it; nobody starts it by hand

    def clean_input(self, data: dict[str, Any]) -> dict[str, Any]:
        delivery_id = data.get("delivery_id")
        if not isinstance(delivery_id, int) or isinstance(delivery_id, bool) or delivery_id < 1:
            raise InputRejected("delivery_id", "must be the id of a webhook delivery")
        return {"delivery_id": delivery_id}

    def prepare(self, ctx: JobContext) -> None:
        # A missing signing secret pauses the job with the name to configure.
        ctx.credential(_delivery(ctx).endpoint.secret_ref)

    def total_units(self, ctx: JobContext) -> int:
        return 1

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        if not ctx.checkpoint:
            yield Unit(key="post", payload=ctx.input, checkpoint={"posted": True})

    def run_unit(self, ctx: JobContext, unit: Unit) -> dict[str, Any]:
        delivery = _delivery(ctx)
        records = Delivery.objects.filter(pk=delivery.pk)
        if delivery.state == DeliveryState.DELIVERED:
            return {"status": delivery.status_code, "already_delivered": True}
        endpoint, event = delivery.endpoint, delivery.event
        if not endpoint.enabled:
            reason = f"endpoint {endpoint.name!r} is disabled"
            notify.fenced_update(ctx, records, state=DeliveryState.FAILED, last_error=reason)
            raise NonRetryable(reason)
        secret = ctx.credential(endpoint.secret_ref)
        content = policy.body(
            event_id=event.event_id,
            event_type=event.event_type,
            created_at=event.created_at.isoformat(),
            summary=event.summary,
            data=event.payload,
        )
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": delivery.idempotency_key,
            policy.SIGNATURE_HEADER: policy.signature(secret, int(time.time()), content),
            "X-Webhook-Event": event.event_type,
            "X-Webhook-Event-Id": event.event_id,
        }
        doubt = delivery.possibly_sent  # an earlier attempt's doubt stays
        if not doubt:
            notify.fenced_update(ctx, records, possibly_sent=True)
        try:
            response = http.request(
                ctx, endpoint.provider, "POST", endpoint.url, content=content, headers=headers
            )
        except HttpRetryLater as exc:
            exhausted = ctx.attempt >= notify.max_attempts(ctx.job_id)
            self._record_attempt(
                ctx,
                records,
                state=DeliveryState.EXHAUSTED if exhausted else DeliveryState.PENDING,
                status=exc.status,
                error=str(exc),
                possibly_sent=doubt or exc.possibly_sent,
            )
            raise
        except HttpError as exc:
            self._record_attempt(
                ctx,
                records,
                state=DeliveryState.FAILED,
                status=exc.status,
                error=str(exc),
                possibly_sent=doubt or exc.possibly_sent,
            )
            raise
        except Exception:
            # Raised before anything was sent: a closed gate (RetryLater, no attempt
            # spent), the provider's auth credential missing (Unavailable), its settings.
            if not doubt:
                notify.fenced_update(ctx, records, possibly_sent=False)
            raise
        faults.reach("webhook_after_post")  # the receiver has it; our record does not yet
        now = timezone.now()
        self._record_attempt(
            ctx,
            records,
            state=DeliveryState.DELIVERED,
            status=response.status,
            delivered_at=now,
            possibly_sent=doubt,
        )
        return {"status": response.status}

    def _record_attempt(
        self,
        ctx: JobContext,
        records: Any,
        *,
        state: str,
        status: int | None,
        error: str = "",
        **extra: Any,
    ) -> None:
        from django.db.models import F

        notify.fenced_update(
            ctx,
            records,
            state=state,
            status_code=status,
            attempts=F("attempts") + 1,
            last_attempt_at=timezone.now(),
            last_error=notify.last_error(error, ctx.secrets),
            **extra,
        )
