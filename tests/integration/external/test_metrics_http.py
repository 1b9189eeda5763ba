"""GET /metrics counts outbound HTTP retries per provider: Retry-After and backoff."""

from __future__ import annotations

import time

import pytest
from django.test import Client as DjangoClient
from prometheus_client.parser import text_string_to_metric_families

from durable import jobs
from durable.api.tokens import new_token
from durable.metrics.totals import OTHER_PROVIDER, classify_retry
from durable.models import Client, Job, JobEvent

from ..servers import Reply
from .conftest import provider_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_classify_retry__provider_only_from_the_settings():
    providers = frozenset({"stripe"})
    message = "stripe: 429 from GET https://api/x; retry at 2026-01-01T00:00:00 (retry-after)"
    assert classify_retry(message, providers) == ("stripe", "retry-after")
    assert classify_retry("stripe: connect timeout (https://api/x); retry at …", providers) == (
        "stripe",
        "backoff",
    )
    assert classify_retry("https://evil.example/?q=1: boom", providers)[0] == OTHER_PROVIDER


def test_http_retries__counted_per_provider_and_source(workers, http_server, provider):
    name = provider()
    http_server.reply("/later", Reply(503, {"Retry-After": "120"}))
    http_server.reply("/down", Reply(503))
    base = http_server.url("")
    told = jobs.enqueue("test.http_calls", {"base": base, "paths": ["/later"], "provider": name})
    down = jobs.enqueue("test.http_calls", {"base": base, "paths": ["/down"], "provider": name})
    env = provider_env(**{name: {"allow_hosts": ["127.0.0.1"], "backoff_base": 0.05,
                                 "backoff_max": 0.1, "max_in_flight": 0}})  # fmt: skip
    for _ in range(20):  # a --burst worker leaves when nothing is due: start another
        proc = workers.run(env=env)
        assert proc.returncode == 0, workers.log(proc)
        if Job.objects.get(pk=down.pk).state == "failed":
            break
        time.sleep(0.1)
    assert Job.objects.get(pk=down.pk).state == "failed"  # 4 attempts: 3 retries, then failed
    assert Job.objects.get(pk=told.pk).state == "queued"  # waiting out its Retry-After
    retries = JobEvent.objects.filter(kind="retry_scheduled")
    assert retries.count() == 4

    token = new_token()
    Client.objects.create(
        name="prom", scopes=["metrics:read"], token_prefix=token.prefix, token_hash=token.hash
    )
    response = DjangoClient().get("/metrics", headers={"Authorization": f"Bearer {token.token}"})
    assert response.status_code == 200
    samples = [
        s
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
        if family.name in ("durable_http_retries", "durable_http_retry_wait_seconds")
    ]
    got = {(s.name, s.labels["provider"], s.labels["source"]): s.value for s in samples}
    assert got[("durable_http_retries_total", name, "retry-after")] == 1
    assert got[("durable_http_retries_total", name, "backoff")] == 3
    assert 119 <= got[("durable_http_retry_wait_seconds_total", name, "retry-after")] <= 121
    assert got[("durable_http_retry_wait_seconds_total", name, "backoff")] < 2


def test_gate_waits__counted_per_provider_and_cause(settings):
    from durable.http import gates
    from durable.http.config import build

    settings.DURABLE_HTTP_PROVIDERS = {"mail": {"max_in_flight": 1}}
    mail = build("mail", {"max_in_flight": 1, "gate_retry_seconds": 1})
    held = gates.acquire(mail)
    for _ in range(2):
        with pytest.raises(gates.GateClosed):
            gates.acquire(mail)
    unlisted = build("https://evil.example/?q=1", {"min_spacing_ms": 10_000})
    gates.acquire(unlisted)
    with pytest.raises(gates.GateClosed):
        gates.acquire(unlisted)
    gates.release(held)

    token = new_token()
    Client.objects.create(
        name="prom", scopes=["metrics:read"], token_prefix=token.prefix, token_hash=token.hash
    )
    response = DjangoClient().get("/metrics", headers={"Authorization": f"Bearer {token.token}"})
    assert response.status_code == 200
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        if family.name in ("durable_http_gate_waits", "durable_http_gate_wait_seconds")
        for s in family.samples
    }
    waits = "durable_http_gate_waits_total"
    assert got[(waits, (("cause", "in_flight"), ("provider", "mail")))] == 2
    assert got[(waits, (("cause", "spacing"), ("provider", "mail")))] == 0
    # A provider the settings do not name is "other": no free text becomes a label.
    assert got[(waits, (("cause", "spacing"), ("provider", OTHER_PROVIDER)))] == 1
    seconds = got[("durable_http_gate_wait_seconds_total", (("provider", "mail"),))]
    assert 2 * 0.5 <= seconds <= 2 * 1.5
