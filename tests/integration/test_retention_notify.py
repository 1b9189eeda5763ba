"""Retention also removes old notifications, once every delivery of them is settled."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from durable import jobs
from durable.models import Job
from durable.webhooks.models import Delivery, Endpoint, OutboundEvent

from .helpers import drain

pytestmark = pytest.mark.django_db
OLD = timezone.now() - timedelta(days=40)


def event(name: str, state: str, *, created=OLD, job_state: str | None = None) -> OutboundEvent:
    endpoint = Endpoint.objects.get_or_create(
        name="ops", defaults={"url": "https://hooks.example.com/x", "secret_ref": "s"}
    )[0]
    outbound = OutboundEvent.objects.create(event_type="t", event_id=name, created_at=created)
    job_id = None
    if job_state:
        job = jobs.enqueue("durable.noop", {"units": 1})
        Job.objects.filter(pk=job.pk).update(state=job_state)
        job_id = job.pk
    Delivery.objects.create(
        event=outbound, endpoint=endpoint, idempotency_key=f"k-{name}", state=state, job_id=job_id
    )
    return outbound


def test_purge__removes_old_settled_notifications_and_keeps_the_rest():
    delivered = event("delivered", "delivered")
    failed = event("failed", "failed")
    pending = event("pending", "pending")
    exhausted_paused = event("exhausted", "exhausted", job_state="paused")  # may be resumed
    recent = event("recent", "delivered", created=timezone.now())
    purge = drain(jobs.enqueue("durable.purge", {"older_than": "30d"}).pk)
    assert purge.state == "completed"
    left = set(OutboundEvent.objects.values_list("event_id", flat=True))
    assert left == {"pending", "exhausted", "recent"}
    assert not Delivery.objects.filter(event_id__in=[delivered.pk, failed.pk]).exists()
    assert Delivery.objects.filter(event__in=[pending, exhausted_paused, recent]).count() == 3
