"""Webhook and mail deliveries on the real database, run in the test's thread (drain)."""

from __future__ import annotations

import json
import socket
import time

import pytest
from django.core.mail.backends.base import BaseEmailBackend

from durable import credential_store, jobs, notify, signals
from durable.lease import claim
from durable.mail.models import MailDelivery, MailRecipient
from durable.models import Job, JobEvent
from durable.webhooks import policy
from durable.webhooks.models import Delivery, Endpoint, OutboundEvent
from durable.worker import Worker

from ..helpers import drain
from ..servers import Reply
from .conftest import use_mailer

pytestmark = pytest.mark.django_db

SECRET = "whsec-test-signing-secret"


@pytest.fixture
def hooks(http_server, provider):
    """A ``webhooks`` provider for the local server and a signing secret in the encrypted table."""
    provider("webhooks")
    credential_store.store("hook-secret", SECRET)

    def endpoint(name: str = "ops", path: str = "/hook", **fields) -> Endpoint:
        fields.setdefault("url", http_server.url(path))
        return Endpoint.objects.create(name=name, secret_ref="hook-secret", **fields)

    return endpoint


def only_delivery() -> Delivery:
    return Delivery.objects.select_related("event", "endpoint").get()


def run_once(job_id: int) -> None:
    """One claim and one execution of the job (a single attempt), in this thread."""
    claimed = claim("w", queues=["default"], operations=["durable.webhook"], lease_seconds=30)
    assert claimed is not None
    assert claimed[0].job_id == job_id
    Worker(worker_id="w").execute(*claimed)


def publish(event_id: str = "evt-1", event_type: str = "job.failed", **payload):
    return notify.publish(event_type, event_id, payload or {"job_id": 7}, summary="job 7 failed")


# --- fan-out --------------------------------------------------------------------------------


def test_publish__one_delivery_and_job_per_matching_destination_and_only_once(hooks):
    hooks("all")
    hooks("jobs", event_filter=["job.*"])
    hooks("recovery", event_filter=["recovery.*"])
    hooks("off", enabled=False)
    MailRecipient.objects.create(name="oncall", email="oncall@example.com", event_filter=["job.*"])
    first = publish()
    assert first.created
    assert len(first.webhook_deliveries) == 2
    assert len(first.mail_deliveries) == 1
    names = set(Delivery.objects.values_list("endpoint__name", flat=True))
    assert names == {"all", "jobs"}
    again = publish()  # the same event once more: nothing new
    assert (again.created, again.webhook_deliveries, again.mail_deliveries) == (False, [], [])
    assert Delivery.objects.count() == 2
    assert MailDelivery.objects.count() == 1
    assert OutboundEvent.objects.count() == 1
    delivery_jobs = Job.objects.filter(operation="durable.webhook")
    assert delivery_jobs.count() == 2
    assert set(Delivery.objects.values_list("job_id", flat=True)) == set(
        delivery_jobs.values_list("pk", flat=True)
    )
    keys = set(Delivery.objects.values_list("idempotency_key", flat=True))
    assert len(keys) == 2


def test_publish__refuses_what_is_not_a_json_object():
    from durable.errors import InputRejected

    with pytest.raises(InputRejected, match="payload"):
        notify.publish("job.failed", "e", {"x": float("nan")})
    with pytest.raises(InputRejected, match="payload"):
        notify.publish("job.failed", "e", {"x": "y" * 70_000})
    with pytest.raises(InputRejected, match="event_id"):
        notify.publish("job.failed", "", {})
    assert not OutboundEvent.objects.exists()


# --- webhook delivery -------------------------------------------------------------------------


def test_webhook__delivers_signed_json_with_the_idempotency_key(hooks, http_server):
    hooks()
    publish(reason="disk full")
    delivery = only_delivery()
    job = drain(delivery.job_id)
    assert job.state == "completed"
    [request] = http_server.requests("/hook")
    assert request.method == "POST"
    assert request.header("Idempotency-Key") == delivery.idempotency_key
    assert request.header("Content-Type") == "application/json"
    assert request.header("X-Webhook-Event") == "job.failed"
    assert policy.verify(SECRET, request.header("X-Signature"), request.body, now=time.time())
    document = json.loads(request.body)
    assert document["id"] == "evt-1"
    assert document["data"] == {"reason": "disk full"}
    delivery.refresh_from_db()
    assert (delivery.state, delivery.status_code, delivery.attempts) == ("delivered", 200, 1)
    assert delivery.delivered_at is not None


def test_webhook__non_retryable_answer_fails_the_delivery_once(
    hooks, http_server, django_capture_on_commit_callbacks
):
    hooks()
    http_server.reply("/hook", Reply(410, body=b"endpoint retired"))
    publish()
    with django_capture_on_commit_callbacks(execute=True) as sent:
        job = drain(only_delivery().job_id)
    assert sent  # the engine did announce the failure…
    assert (job.state, job.error_code) == ("failed", "non_retryable")
    assert len(http_server.requests("/hook")) == 1
    delivery = only_delivery()
    assert (delivery.state, delivery.status_code) == ("failed", 410)
    assert "410" in delivery.last_error
    assert "endpoint retired" in delivery.last_error
    # …but a delivery job's own failure is not published again (no notification loops).
    assert not OutboundEvent.objects.exclude(event_id="evt-1").exists()


def test_webhook__retries_with_the_same_key_until_delivered(hooks, http_server):
    hooks()
    http_server.reply("/hook", Reply(503), Reply(502), Reply(200))
    publish()
    job = drain(only_delivery().job_id)
    assert (job.state, job.attempts) == ("completed", 2)
    requests = http_server.requests("/hook")
    assert len(requests) == 3
    assert len({r.header("Idempotency-Key") for r in requests}) == 1
    assert len({r.body for r in requests}) == 1  # byte-identical body on every retry
    delivery = only_delivery()
    assert (delivery.state, delivery.attempts) == ("delivered", 3)


def test_webhook__exhaustion_keeps_the_job_and_marks_the_delivery(hooks, http_server):
    hooks()
    http_server.reply("/hook", Reply(503, body=b"down"))
    publish()
    delivery = only_delivery()
    Job.objects.filter(pk=delivery.job_id).update(max_attempts=3)
    job = drain(delivery.job_id)
    assert (job.state, job.error_code, job.attempts) == ("failed", "exhausted", 3)
    assert Job.objects.filter(pk=job.pk).exists()
    assert len(job.errors) == 3
    assert len(http_server.requests("/hook")) == 3
    delivery.refresh_from_db()
    assert (delivery.state, delivery.status_code, delivery.attempts) == ("exhausted", 503, 3)


def test_webhook__redelivery_reuses_the_idempotency_key(hooks, http_server):
    hooks()
    publish()
    delivery = only_delivery()
    drain(delivery.job_id)
    job = notify.redeliver(delivery.pk, actor="alice")
    assert job.owner == "alice"
    assert drain(job.pk).state == "completed"
    keys = [r.header("Idempotency-Key") for r in http_server.requests("/hook")]
    assert keys == [delivery.idempotency_key] * 2
    delivery.refresh_from_db()
    assert (delivery.state, delivery.redeliveries, delivery.job_id) == ("delivered", 1, job.pk)


def test_webhook__redelivery_wakes_a_job_waiting_in_backoff(hooks, http_server):
    hooks()
    http_server.reply("/hook", Reply(503, {"Retry-After": "3600"}), Reply(200))
    publish()
    delivery = only_delivery()
    run_once(delivery.job_id)
    waiting = Job.objects.get(pk=delivery.job_id)
    assert waiting.state == "queued"
    assert waiting.attempts == 1
    again = notify.redeliver(delivery.pk)
    assert again.pk == waiting.pk  # the same job, woken up
    assert drain(again.pk).state == "completed"
    assert len(http_server.requests("/hook")) == 2


def test_webhook__a_missing_secret_pauses_the_job_with_what_to_configure(http_server, provider):
    provider("webhooks")
    Endpoint.objects.create(name="x", url=http_server.url("/hook"), secret_ref="nowhere")
    publish()
    job = drain(only_delivery().job_id)
    assert job.state == "paused"
    assert "nowhere" in job.reason
    assert "credential set nowhere" in job.reason
    assert http_server.requests() == []
    assert only_delivery().state == "pending"


def test_webhook__ssrf_refusal_fails_the_delivery_and_is_reported(hooks, http_server):
    seen = []
    signals.security_refusal.connect(receiver := lambda sender, **kw: seen.append(kw))
    try:
        hooks(url=http_server.url("/hook", host="localhost"))
        publish()
        job = drain(only_delivery().job_id)
    finally:
        signals.security_refusal.disconnect(receiver)
    assert (job.state, job.error_code) == ("failed", "non_retryable")
    assert http_server.requests() == []
    assert "loopback" in only_delivery().last_error
    assert [(e["category"], e["key"]) for e in seen] == [("ssrf", "ssrf-loopback")]


def test_webhook__cancel_marks_the_delivery_and_sends_nothing(
    hooks, http_server, django_capture_on_commit_callbacks
):
    hooks()
    publish()
    delivery = only_delivery()
    with django_capture_on_commit_callbacks(execute=True):  # the engine signals after commit
        assert jobs.cancel(delivery.job_id, actor="ops").applied
    delivery.refresh_from_db()
    assert delivery.state == "cancelled"
    assert drain(delivery.job_id).state == "cancelled"
    assert http_server.requests() == []


def test_webhook__a_timeout_after_posting_keeps_possibly_sent_through_exhaustion(
    hooks, http_server, provider
):
    hooks()
    provider("webhooks", total_timeout=0.5)
    http_server.reply("/hook", Reply(200, delay=2))  # it has the POST; we never hear back
    publish()
    delivery = only_delivery()
    Job.objects.filter(pk=delivery.job_id).update(max_attempts=2)
    job = drain(delivery.job_id)
    assert (job.state, job.error_code) == ("failed", "exhausted")
    assert len(http_server.requests("/hook")) == 2
    delivery.refresh_from_db()
    assert (delivery.state, delivery.possibly_sent) == ("exhausted", True)


def test_webhook__an_answer_or_a_refused_connection_leaves_no_doubt(hooks, http_server):
    with socket.socket() as probe:  # a port nobody listens on: connection refused
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    hooks("refused", url=f"http://127.0.0.1:{closed}/hook")
    hooks("answers")
    http_server.reply("/hook", Reply(503))
    publish()
    for delivery in Delivery.objects.all():
        run_once(delivery.job_id)
    records = {d.endpoint.name: d for d in Delivery.objects.select_related("endpoint")}
    assert (records["refused"].state, records["refused"].possibly_sent) == ("pending", False)
    assert (records["answers"].state, records["answers"].possibly_sent) == ("pending", False)
    assert records["answers"].status_code == 503
    http_server.reply("/hook", Reply(200))
    assert drain(records["answers"].job_id).state == "completed"
    delivered = Delivery.objects.get(pk=records["answers"].pk)
    assert (delivered.state, delivered.possibly_sent) == ("delivered", False)


def test_webhook__a_pause_before_sending_leaves_no_doubt(hooks, http_server, provider):
    hooks()
    provider("webhooks", auth_credential="partner-token")  # nobody configured it
    publish()
    job = drain(only_delivery().job_id)
    assert job.state == "paused"
    assert "partner-token" in job.reason
    assert http_server.requests() == []
    delivery = only_delivery()
    assert (delivery.state, delivery.possibly_sent) == ("pending", False)


def test_webhook__cancel_keeps_the_doubt_of_a_post_never_recorded(
    hooks, http_server, django_capture_on_commit_callbacks
):
    hooks()
    publish()
    delivery = only_delivery()
    # What a worker killed right after its POST leaves behind (test_deliveries_crash
    # proves the real crash does): marked before posting, outcome never recorded.
    Delivery.objects.filter(pk=delivery.pk).update(possibly_sent=True)
    with django_capture_on_commit_callbacks(execute=True):
        assert jobs.cancel(delivery.job_id, actor="ops").applied
    delivery.refresh_from_db()
    assert (delivery.state, delivery.possibly_sent) == ("cancelled", True)
    assert "may have been sent" in delivery.last_error


def test_webhook__pause_during_backoff_holds_until_resumed(hooks, http_server):
    hooks()
    http_server.reply("/hook", Reply(503, {"Retry-After": "1"}), Reply(200))
    publish()
    delivery = only_delivery()
    run_once(delivery.job_id)
    assert jobs.pause(delivery.job_id, actor="ops").applied
    time.sleep(1.1)  # the backoff is over, but the job is paused
    assert claim("w", queues=["default"], operations=["durable.webhook"], lease_seconds=30) is None
    assert len(http_server.requests()) == 1
    assert jobs.resume(delivery.job_id, actor="ops").applied
    assert drain(delivery.job_id).state == "completed"
    assert len(http_server.requests()) == 2


# --- what the engine reports ---------------------------------------------------------------


def test_engine_problem__a_job_that_needs_attention_is_published(
    hooks, http_server, django_capture_on_commit_callbacks
):
    hooks(event_filter=["job.*"])
    failed = jobs.enqueue("test.flaky", {"fail_times": 9, "error": "nonretryable", "message": "x"})
    with django_capture_on_commit_callbacks(execute=True):  # the engine signals after commit
        drain(failed.pk)
    event = OutboundEvent.objects.get()
    assert event.event_type == "job.failed"
    assert event.payload["job_id"] == failed.pk
    assert event.payload["cause"] == "non_retryable"
    assert drain(only_delivery().job_id).state == "completed"
    assert json.loads(http_server.requests("/hook")[0].body)["data"]["operation"] == "test.flaky"


def test_engine_problem__error_recovery_events_are_published_once(hooks):
    hooks(event_filter=["recovery.*"])
    facts = {"type": "corruption-detected", "detail": "page 7 checksum", "db": "wekan"}
    signals.send_now(signals.recovery_event, severity="warning", **{**facts, "type": "bloat"})
    signals.send_now(signals.recovery_event, severity="error", **facts)
    signals.send_now(signals.recovery_event, severity="error", **facts)  # the same, again
    event = OutboundEvent.objects.get()
    assert event.event_type == "recovery.corruption-detected"
    assert event.payload["detail"] == "page 7 checksum"
    assert Delivery.objects.count() == 1


# --- mail -------------------------------------------------------------------------------------


@pytest.fixture
def recipient(smtp_server):
    return MailRecipient.objects.create(name="oncall", email="oncall@example.com")


def test_mail__sends_through_the_smtp_backend_with_a_stable_message_id(recipient, smtp_server):
    publish()
    mail = MailDelivery.objects.get()
    assert drain(mail.job_id).state == "completed"
    [message] = smtp_server.messages
    assert message.rcpt_tos == ["oncall@example.com"]
    assert message.header("Message-ID") == mail.message_id
    assert message.header("Subject") == "[durable] job 7 failed"
    assert b"at-least-once" in message.content
    mail.refresh_from_db()
    assert (mail.state, mail.guarantee, mail.possibly_duplicate) == ("sent", "at-least-once", False)


def test_mail__temporary_refusal_is_retried_permanent_one_fails(recipient, smtp_server):
    smtp_server.replies = ["451 4.3.0 try again later"]
    publish("e1")
    first = MailDelivery.objects.get()
    Job.objects.filter(pk=first.job_id).update(next_attempt_at=first.created_at)
    from durable.mail.operations import SendMail

    SendMail.backoff_base, base = 0.01, SendMail.backoff_base
    try:
        assert drain(first.job_id).state == "completed"
        smtp_server.replies = ["554 5.7.1 rejected as spam"]
        publish("e2")
        second = MailDelivery.objects.get(event__event_id="e2")
        job = drain(second.job_id)
    finally:
        SendMail.backoff_base = base
    assert len(smtp_server.messages) == 1
    assert (job.state, job.error_code) == ("failed", "non_retryable")
    second.refresh_from_db()
    assert second.state == "failed"
    assert "554" in second.last_error


def test_mail__a_replay_that_finds_sending_reports_possibly_sent_twice(recipient, smtp_server):
    publish()
    mail = MailDelivery.objects.get()
    # What a worker killed between the SMTP send and the record leaves behind:
    MailDelivery.objects.filter(pk=mail.pk).update(state="sending", send_attempts=1)
    assert drain(mail.job_id).state == "completed"
    mail.refresh_from_db()
    assert (mail.state, mail.possibly_duplicate, mail.send_attempts) == ("sent", True, 2)
    assert "possibly sent twice" in mail.last_error
    assert JobEvent.objects.filter(job_id=mail.job_id, kind="possibly_sent_twice").exists()


def test_publish__stores_nothing_when_nobody_listens():
    result = publish()
    assert (result.created, result.webhook_deliveries, result.mail_deliveries) == (False, [], [])
    assert not OutboundEvent.objects.exists()


def test_mail__cancel_marks_the_record_and_sends_nothing(
    recipient, smtp_server, django_capture_on_commit_callbacks
):
    publish()
    mail = MailDelivery.objects.get()
    with django_capture_on_commit_callbacks(execute=True):  # the engine signals after commit
        assert jobs.cancel(mail.job_id, actor="ops").applied
    mail.refresh_from_db()
    assert mail.state == "cancelled"
    assert drain(mail.job_id).state == "cancelled"
    assert smtp_server.messages == []


def test_mail__cancel_while_sending_keeps_possibly_sent(
    recipient, smtp_server, django_capture_on_commit_callbacks
):
    publish()
    mail = MailDelivery.objects.get()
    MailDelivery.objects.filter(pk=mail.pk).update(state="sending", send_attempts=1)
    with django_capture_on_commit_callbacks(execute=True):
        assert jobs.cancel(mail.job_id, actor="ops").applied
    mail.refresh_from_db()
    assert (mail.state, mail.possibly_sent) == ("cancelled", True)
    assert "may have been sent" in mail.last_error


def test_mail__exhausted_after_a_dropped_connection_says_possibly_sent(
    recipient, smtp_server, django_capture_on_commit_callbacks
):
    smtp_server.replies = ["drop"]  # the server takes the message and hangs up
    publish()
    mail = MailDelivery.objects.get()
    Job.objects.filter(pk=mail.job_id).update(max_attempts=1)
    with django_capture_on_commit_callbacks(execute=True):  # the engine signals after commit
        job = drain(mail.job_id)
    assert (job.state, job.error_code) == ("failed", "exhausted")
    assert len(smtp_server.messages) == 1  # it did go out
    mail.refresh_from_db()
    assert (mail.state, mail.possibly_sent) == ("exhausted", True)


class SendsNothing(BaseEmailBackend):
    """An email backend that reports 0 messages sent (as a filtering backend may)."""

    def send_messages(self, email_messages):
        return 0


def test_mail__a_backend_that_sends_nothing_is_not_recorded_as_sent(settings):
    use_mailer(settings, f"{__name__}.SendsNothing")
    MailRecipient.objects.create(name="oncall", email="oncall@example.com")
    publish()
    mail = MailDelivery.objects.get()
    Job.objects.filter(pk=mail.job_id).update(max_attempts=1)
    job = drain(mail.job_id)
    assert (job.state, job.error_code) == ("failed", "exhausted")
    mail.refresh_from_db()
    assert (mail.state, mail.possibly_sent) == ("exhausted", False)
    assert "sent nothing" in mail.last_error
