"""Recording a Recovery event by hand from the Recovery page."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from durable.webhooks.models import Endpoint, OutboundEvent
from recovery.models import RecoveryEvent, SecurityEvent

pytestmark = pytest.mark.django_db
URL = "/problems/recovery/record/"
FORM = {"type": "restore-backup", "severity": "warning", "outcome": "done", "db": "wekan",
        "detail": "Restored wekan.sqlite from last night's copy by hand"}  # fmt: skip


def recorder(name: str = "operator", **extra: str) -> Client:
    user = User.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["add_recoveryevent", "view_recoveryevent"])
    )
    client = Client(**extra)
    client.force_login(user)
    return client


def test_anonymous_gets_the_login_page_and_nonstaff_or_readonly_staff_get_403(client_for):
    assert client_for("anonymous").get(URL)["Location"].startswith("/problems/login/")
    assert client_for("nonstaff").get(URL).status_code == 403
    readonly = client_for("readonly")
    assert readonly.post(URL, FORM).status_code == 403
    assert b"Record event" not in readonly.get("/problems/recovery/").content
    assert not RecoveryEvent.objects.filter(type="restore-backup").exists()
    assert SecurityEvent.objects.filter(key="no-permission:record").exists()


def test_a_recorded_event_names_its_author_and_address(client_for):
    client = recorder(REMOTE_ADDR="203.0.113.7")
    assert b"Record event" in client.get("/problems/recovery/").content
    response = client.post(URL, FORM)
    assert response.status_code == 302
    event = RecoveryEvent.objects.get(type="restore-backup")
    assert (event.source, event.severity, event.done, event.db) == (
        "admin-panel", "warning", True, "wekan",
    )  # fmt: skip
    assert (event.username, event.ipv4) == ("operator", "203.0.113.7")
    assert "by hand" in event.detail


def test_a_failed_error_event_counts_as_a_problem_and_is_published(client_for):
    Endpoint.objects.create(
        name="ops", url="https://hooks.example.com/x", secret_ref="s", event_filter=["recovery.*"]
    )
    client = recorder()
    client.post(URL, {**FORM, "type": "manual-required", "severity": "error", "outcome": "failed"})
    event = RecoveryEvent.objects.get(type="manual-required")
    assert event.done is False
    assert OutboundEvent.objects.get().event_type == "recovery.manual-required"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"type": "   "}, "required"),
        ({"severity": "catastrophic"}, "Select a valid choice"),
        ({"detail": ""}, "required"),
        ({"detail": "x" * 5000}, "at most 4000"),
    ],
)
def test_bad_input_is_refused_field_by_field_and_records_nothing(change, message):
    response = recorder().post(URL, {**FORM, **change})
    assert response.status_code == 200
    assert message in response.content.decode()
    assert not RecoveryEvent.objects.exists()


def test_hostile_text_is_shown_escaped():
    recorder().post(URL, {**FORM, "detail": '"><img src=x onerror="alert(1)"> <script>x</script>'})
    page = recorder("another").get("/problems/recovery/").content.decode()
    assert "<script>x</script>" not in page
    assert "&lt;script&gt;x&lt;/script&gt;" in page
