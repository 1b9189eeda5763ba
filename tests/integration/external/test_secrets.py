"""Negative tests: no secret and no large response body survives anywhere we keep things.

Real workers make real requests that carry the secrets (a bearer token from
the encrypted credential table, a webhook signing secret, an SMTP password
reference) to servers that echo them back in error bodies and answer with
large bodies carrying a marker. Afterwards every row of every durable table —
jobs, events, error histories, unit results, delivery records, outbound
events, gate slots, credentials — and every log line of the workers and of
this process is scanned for the secrets and the marker.
"""

from __future__ import annotations

import logging
import signal

import pytest
from django.apps import apps
from django.core import serializers

from durable import credential_store, notify
from durable.credential_store import Credential
from durable.jobs import enqueue
from durable.mail.models import MailRecipient
from durable.models import Job
from durable.webhooks.models import Endpoint
from tests.conftest import wait_until

from ..servers import Reply
from .conftest import provider_env, smtp_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

API_TOKEN = "tok-Zq81-api-token-never-stored"
SIGNING_SECRET = "whsec-Xy72-signing-secret-never-stored"
SMTP_PASSWORD = "smtp-Pw55-password-never-stored"
MARKER = "LARGE-BODY-MARKER-4c1e"
PADDING = "p" * 4096  # keeps the marker beyond any short excerpt


def everything_stored() -> str:
    """Every row of every model of the durable app and the test app, as JSON text."""
    models = [
        *apps.get_app_config("durable").get_models(),
        *apps.get_app_config("testapp").get_models(),
    ]
    return "\n".join(serializers.serialize("json", model.objects.all()) for model in models)


def echo_auth(status: int):
    def reply(record):
        told = f"refused: Authorization={record.header('Authorization')} {PADDING}{MARKER}"
        return Reply(status, body=told.encode())

    return reply


def test_secrets_and_large_bodies__are_never_persisted_or_logged(
    workers, http_server, smtp_server, caplog
):
    caplog.set_level(logging.DEBUG)
    credential_store.store("api-token", API_TOKEN)
    credential_store.store("hook-secret", SIGNING_SECRET)
    credential_store.store("smtp-pass", SMTP_PASSWORD)
    big_ok = (PADDING + MARKER) * 10  # 40 kB, under the limit: read, never stored
    http_server.reply("/denied", echo_auth(401))
    http_server.reply("/flaky", echo_auth(503), Reply(200, body=big_ok.encode()))
    http_server.reply("/declared-huge", Reply(200, body=(PADDING + MARKER).encode() * 100))
    http_server.reply(
        "/endless", Reply(stream_bytes=8 * 1024 * 1024, chunk=(PADDING + MARKER).encode() * 16)
    )
    http_server.reply("/hook", echo_auth(500), Reply(200, body=big_ok.encode()))
    base = http_server.url("")
    for path in ("/denied", "/flaky", "/declared-huge", "/endless"):
        enqueue("test.http_calls", {"base": base, "paths": [path]})
    Endpoint.objects.create(name="ops", url=http_server.url("/hook"), secret_ref="hook-secret")
    MailRecipient.objects.create(name="oncall", email="oncall@example.com")
    notify.publish("job.failed", "evt-secret", {"job_id": 1}, summary="job 1 failed")

    limits = {"allow_hosts": ["127.0.0.1"], "backoff_base": 0.05, "backoff_max": 0.1}
    env = {
        **provider_env(
            api={**limits, "auth_credential": "api-token", "max_body_bytes": 100_000},
            webhooks=limits,
        ),
        **smtp_env(smtp_server),
        "DURABLE_MAIL_PASSWORD_REF": "smtp-pass",
        "LOG_LEVEL": "DEBUG",
    }
    worker = workers.start(env=env)
    wait_until(lambda: not Job.objects.unfinished().exists(), timeout=60, interval=0.2)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0
    log_text = workers.log(worker) + caplog.text

    # The secrets and the marker really travelled: the scan below can find them if kept.
    sent = http_server.requests()
    assert any(r.header("Authorization") == f"Bearer {API_TOKEN}" for r in sent)
    assert all(SIGNING_SECRET not in (r.header("X-Signature") or "") for r in sent)
    calls = sorted(
        (job.input["paths"][0], job.state, job.error_code)
        for job in Job.objects.filter(operation="test.http_calls")
    )
    assert calls == [
        ("/declared-huge", "failed", "non_retryable"),
        ("/denied", "failed", "non_retryable"),
        ("/endless", "failed", "non_retryable"),
        ("/flaky", "completed", ""),  # 503 with the echo, then the big 200
    ]
    # Every failure was published too (webhook and mail), and each of those delivered.
    deliveries = Job.objects.filter(operation__in=["durable.webhook", "durable.mail"])
    assert deliveries.count() == 8
    assert set(deliveries.values_list("state", flat=True)) == {"completed"}
    stored = everything_stored()
    assert "[redacted]" in stored  # the echoed token was recorded — redacted
    assert "response too large" in stored

    for secret in (API_TOKEN, SIGNING_SECRET, SMTP_PASSWORD):
        assert secret not in stored
        assert secret not in log_text
    assert MARKER not in stored
    assert MARKER not in log_text
    # Credentials are stored encrypted: no plaintext in the table itself either.
    assert all(API_TOKEN not in c for c in Credential.objects.values_list("ciphertext", flat=True))
