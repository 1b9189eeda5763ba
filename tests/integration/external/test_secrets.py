"""Negative tests: no secret and no large response body survives anywhere we keep things.

Real workers make real requests that carry the secrets (bearer tokens from the
encrypted credential table and the environment, a ~960-character JWT-like
token, a webhook signing secret, an SMTP password the server really checks)
to servers that echo them back in error bodies, redirect them to another
origin, and answer with large bodies carrying a marker. A credential with a
control character and one with a trailing newline come from the environment.
Afterwards every row of every table of the durable app, the recovery app
(the Recovery and Security reports) and the test app — jobs, events, error
histories and their tracebacks, unit results, delivery records, outbound
events, gate slots, credentials, security events — and every log line of
the workers and of this process is scanned for the secrets and the marker.
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
from recovery.models import SecurityEvent
from tests.conftest import wait_until

from ..servers import HttpServer, Reply
from .conftest import SMTP_USER, provider_env, smtp_env

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    # aiosmtpd warns that AUTH without TLS is unsafe; this server is on loopback only.
    pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS:UserWarning"),
]

API_TOKEN = "tok-Zq81-api-token-never-stored"
SIGNING_SECRET = "whsec-Xy72-signing-secret-never-stored"
SMTP_PASSWORD = "smtp-Pw55-password-never-stored"
# JWT-like, about 960 characters: longer than any excerpt, so a cut could keep its head.
LONG_TOKEN = "eyJhbGciOiJSUzI1NiJ9." + "eyJzdWIiOiJub3Qtc3RvcmVkIn0" * 34 + ".c2lnLW5ldmVy"
HOP_KEY = "hopkey-Rd31-never-leaves-its-origin"
CTRL_TOKEN = "ctrl-Qm09-never-stored\x01tail"  # a control character: refused, job paused
NEWLINE_TOKEN = "nl-Vb47-token-never-stored"  # given with a trailing newline: stripped
SECRETS = (
    API_TOKEN,
    SIGNING_SECRET,
    SMTP_PASSWORD,
    LONG_TOKEN,
    HOP_KEY,
    CTRL_TOKEN,
    NEWLINE_TOKEN,
)
MARKER = "LARGE-BODY-MARKER-4c1e"
PADDING = "p" * 4096  # keeps the marker beyond any short excerpt


def everything_stored() -> str:
    """Every row of every model of the durable, recovery and test apps, as JSON text."""
    models = [
        *apps.get_app_config("durable").get_models(),
        *apps.get_app_config("recovery").get_models(),
        *apps.get_app_config("testapp").get_models(),
    ]
    return "\n".join(serializers.serialize("json", model.objects.all()) for model in models)


def pieces(secret: str, size: int = 12) -> list[str]:
    """Every ``size``-character window of ``secret`` (the control-character one: its head)."""
    text = secret.split("\x01")[0]
    return [text[i : i + size] for i in range(0, len(text) - size + 1)]


def leaks(text: str) -> list[str]:
    return [piece for secret in SECRETS for piece in pieces(secret) if piece in text]


def echo_auth(status: int):
    def reply(record):
        told = f"refused: Authorization={record.header('Authorization')} {PADDING}{MARKER}"
        return Reply(status, body=told.encode())

    return reply


def test_secrets_and_large_bodies__are_never_persisted_or_logged(
    workers, http_server, smtp_login_server, caplog
):
    caplog.set_level(logging.DEBUG)
    smtp_login_server.logins[SMTP_USER] = SMTP_PASSWORD
    credential_store.store("api-token", API_TOKEN)
    credential_store.store("long-token", LONG_TOKEN)
    credential_store.store("hop-key", HOP_KEY)
    credential_store.store("hook-secret", SIGNING_SECRET)
    credential_store.store("smtp-pass", SMTP_PASSWORD)
    other_origin = HttpServer()
    try:
        big_ok = (PADDING + MARKER) * 10  # 40 kB, under the limit: read, never stored
        http_server.reply("/denied", echo_auth(401))
        http_server.reply("/long-denied", echo_auth(401))
        http_server.reply("/flaky", echo_auth(503), Reply(200, body=big_ok.encode()))
        http_server.reply("/declared-huge", Reply(200, body=(PADDING + MARKER).encode() * 100))
        http_server.reply(
            "/endless", Reply(stream_bytes=8 * 1024 * 1024, chunk=(PADDING + MARKER).encode() * 16)
        )
        http_server.reply("/hop", Reply(302, {"Location": other_origin.url("/landed")}))
        http_server.reply("/hook", echo_auth(500), Reply(200, body=big_ok.encode()))
        base = http_server.url("")
        calls = [
            ("api", "/denied"),
            ("api", "/flaky"),
            ("api", "/declared-huge"),
            ("api", "/endless"),
            ("long", "/long-denied"),  # B1: the long token echoed in an error body
            ("hop", "/hop"),  # B2: a redirect to another origin with the key in X-Api-Key
            ("ctrl", "/never"),  # S1: a control character in the credential
            ("newline", "/newline"),  # S1: a trailing newline, stripped
        ]
        for name, path in calls:
            enqueue("test.http_calls", {"base": base, "paths": [path], "provider": name})
        enqueue(  # an SSRF refusal: its Security report row is scanned too
            "test.http_calls", {"base": "http://10.0.0.1", "paths": ["/"], "provider": "ssrf"}
        )
        Endpoint.objects.create(name="ops", url=http_server.url("/hook"), secret_ref="hook-secret")
        MailRecipient.objects.create(name="oncall", email="oncall@example.com")
        notify.publish("job.failed", "evt-secret", {"job_id": 1}, summary="job 1 failed")

        local = {"allow_hosts": ["127.0.0.1"], "backoff_base": 0.05, "backoff_max": 0.1}
        env = {
            **provider_env(
                api={**local, "auth_credential": "api-token", "max_body_bytes": 100_000},
                long={**local, "auth_credential": "long-token"},
                hop={
                    **local,
                    "follow_redirects": True,
                    "auth_credential": "hop-key",
                    "auth_header": "X-Api-Key",
                    "auth_scheme": "",
                },
                ctrl={**local, "auth_credential": "ctrl-token"},
                newline={**local, "auth_credential": "nl-token"},
                ssrf={"allow_hosts": [], "max_in_flight": 0},
                webhooks=local,
            ),
            **smtp_env(smtp_login_server),
            "EMAIL_HOST_USER": SMTP_USER,
            "DURABLE_MAIL_PASSWORD_REF": "smtp-pass",
            "DURABLE_CREDENTIAL_CTRL_TOKEN": CTRL_TOKEN,
            "DURABLE_CREDENTIAL_NL_TOKEN": NEWLINE_TOKEN + "\n",
            "LOG_LEVEL": "DEBUG",
        }
        worker = workers.start(env=env)
        busy = ("queued", "running", "cancelling")  # the ctrl job stays paused, as it should
        wait_until(
            lambda: not Job.objects.filter(state__in=busy).exists(), timeout=90, interval=0.2
        )
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=15) == 0
        landed = other_origin.requests("/landed")
    finally:
        other_origin.close()
    log_text = workers.log(worker) + caplog.text

    # The secrets and the marker really travelled: the scan below can find them if kept.
    sent = http_server.requests()
    assert any(r.header("Authorization") == f"Bearer {API_TOKEN}" for r in sent)
    assert any(r.header("Authorization") == f"Bearer {LONG_TOKEN}" for r in sent)
    assert any(r.header("Authorization") == f"Bearer {NEWLINE_TOKEN}" for r in sent)
    assert [r.header("X-Api-Key") for r in http_server.requests("/hop")] == [HOP_KEY]
    assert all(SIGNING_SECRET not in (r.header("X-Signature") or "") for r in sent)
    assert http_server.requests("/never") == []
    # The SMTP password was really used: the server required AUTH and accepted it.
    assert smtp_login_server.logins_seen
    assert set(smtp_login_server.logins_seen) == {(SMTP_USER, True)}
    assert smtp_login_server.messages
    # B2: the other origin got the request, and none of the key.
    [hopped] = landed
    assert hopped.header("X-Api-Key") is None
    assert not leaks(" ".join(hopped.headers.values()))

    calls_done = sorted(
        (job.input["provider"], job.input["paths"][0], job.state, job.error_code)
        for job in Job.objects.filter(operation="test.http_calls")
    )
    assert calls_done == [
        ("api", "/declared-huge", "failed", "non_retryable"),
        ("api", "/denied", "failed", "non_retryable"),
        ("api", "/endless", "failed", "non_retryable"),
        ("api", "/flaky", "completed", ""),  # 503 with the echo, then the big 200
        ("ctrl", "/never", "paused", "unavailable"),  # the reason names the variable
        ("hop", "/hop", "completed", ""),
        ("long", "/long-denied", "failed", "non_retryable"),
        ("newline", "/newline", "completed", ""),
        ("ssrf", "/", "failed", "non_retryable"),
    ]
    paused = Job.objects.get(state="paused")
    assert "DURABLE_CREDENTIAL_CTRL_TOKEN" in paused.reason
    # Every problem was published too (webhook and mail), and each of those delivered.
    deliveries = Job.objects.filter(operation__in=["durable.webhook", "durable.mail"])
    assert deliveries.count() == 2 * 7  # 5 failed + 1 paused + the event published above
    assert set(deliveries.values_list("state", flat=True)) == {"completed"}
    assert SecurityEvent.objects.filter(key="ssrf-private").exists()
    stored = everything_stored()
    assert "[redacted]" in stored  # the echoed tokens were recorded — redacted
    assert "response too large" in stored

    assert not leaks(stored)
    assert not leaks(log_text)
    assert MARKER not in stored
    assert MARKER not in log_text
    # Credentials are stored encrypted: no plaintext in the table itself either.
    ciphertexts = " ".join(Credential.objects.values_list("ciphertext", flat=True))
    assert not leaks(ciphertexts)
