"""Operators redeliver a webhook (or resend a mail) from the admin, with the same key."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from durable.models import Job
from durable.webhooks.models import Delivery, Endpoint, OutboundEvent

pytestmark = pytest.mark.django_db
URL = "/admin/durable/delivery/"


def delivery() -> Delivery:
    endpoint = Endpoint.objects.create(
        name="ops", url="https://hooks.example.com/x", secret_ref="s"
    )
    event = OutboundEvent.objects.create(event_type="job.failed", event_id="job:1:5")
    return Delivery.objects.create(
        event=event, endpoint=endpoint, idempotency_key="key-1", state="failed"
    )


def staff(*codenames: str) -> Client:
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_delivery", *codenames])
    )
    client = Client()
    client.force_login(user)
    return client


def test_redeliver__queues_the_delivery_again_with_its_idempotency_key():
    record = delivery()
    client = staff("retry_job")
    response = client.post(URL, {"action": "redeliver", "_selected_action": [record.pk]})
    assert response.status_code == 302
    record.refresh_from_db()
    assert (record.state, record.idempotency_key, record.redeliveries) == ("pending", "key-1", 1)
    job = Job.objects.get(pk=record.job_id)
    assert (job.operation, job.state, job.owner) == ("durable.webhook", "queued", "admin:ops")


def test_redeliver__needs_the_retry_permission():
    record = delivery()
    client = staff()  # may look, may not retry
    assert b"Deliver again" not in client.get(URL).content
    client.post(URL, {"action": "redeliver", "_selected_action": [record.pk]})
    record.refresh_from_db()
    assert (record.state, record.redeliveries, record.job_id) == ("failed", 0, None)
