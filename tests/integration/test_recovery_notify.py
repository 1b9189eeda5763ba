"""Errors reported by the launch scripts (and by administrators) reach webhooks and mail."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from durable.jobs import enqueue
from durable.webhooks.models import Delivery, Endpoint, OutboundEvent

from .helpers import drain

pytestmark = pytest.mark.django_db

LINES = (
    '{"type": "corruption-detected", "severity": "error", "db": "wekan", "detail": "bad page"}\n'
    '{"type": "backup-created", "severity": "info", "detail": "fine"}\n'
    '{"type": "restore-prev", "severity": "error", "detail": "restored the previous copy"}\n'
)


def ingest(path) -> None:
    job = drain(enqueue("recovery.ingest", {"path": str(path)}).pk)
    assert job.state == "completed", job.reason


@pytest.fixture
def hook():
    return Endpoint.objects.create(
        name="ops", url="https://hooks.example.com/x", secret_ref="hook-secret",
        event_filter=["recovery.*"],
    )  # fmt: skip


def test_error_lines_of_the_jsonl_file_are_published_once(tmp_path, hook):
    path = tmp_path / "recovery-events.jsonl"
    path.write_text(LINES)
    ingest(path)
    types = sorted(OutboundEvent.objects.values_list("event_type", flat=True))
    assert types == ["recovery.corruption-detected", "recovery.restore-prev"]  # not the info line
    assert Delivery.objects.filter(endpoint=hook).count() == 2
    payload = OutboundEvent.objects.get(event_type="recovery.corruption-detected").payload
    assert (payload["db"], payload["detail"], payload["severity"]) == ("wekan", "bad page", "error")
    # The file grows; the next ingest publishes only the new error, never the old ones again.
    with path.open("a") as handle:
        handle.write('{"type": "manual-required", "severity": "error", "detail": "look"}\n')
    ingest(path)
    assert OutboundEvent.objects.count() == 3
    assert Delivery.objects.count() == 3


def test_nothing_is_stored_when_nobody_listens(tmp_path):
    path = tmp_path / "recovery-events.jsonl"
    path.write_text(LINES)
    ingest(path)
    assert not OutboundEvent.objects.exists()


def test_an_error_recorded_by_hand_is_published(hook):
    call_command(
        "record_recovery_event", "manual-required", "--detail", "disk full", "--severity", "error"
    )
    event = OutboundEvent.objects.get()
    assert event.event_type == "recovery.manual-required"
    assert event.payload["detail"] == "disk full"
    call_command("record_recovery_event", "manual-required", "--detail", "all good")  # info
    assert OutboundEvent.objects.count() == 1
