"""An SSRF refusal in a real job ends up in the Security report, one row per kind, counted.

A real worker subprocess runs real ``durable.http`` calls that the guard
refuses; the signal it sends reaches ``recovery``'s receiver, which keeps one
``SecurityEvent`` row per kind of address with a count. ``transaction=True``:
the worker is another process and must see the jobs, and we must see its rows.
"""

from __future__ import annotations

import pytest

from durable.jobs import enqueue
from durable.models import Job
from recovery.models import SecurityEvent

from .conftest import provider_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_ssrf_refusal__in_a_worker_is_counted_in_the_security_report(workers):
    targets = [
        "http://10.0.0.1/a?token=q-secret-1",
        "http://10.20.30.40/b",  # another private address: the same row, count 2
        "http://169.254.169.254/latest/meta-data",  # the cloud metadata service
    ]
    for url in targets:
        enqueue("test.http_calls", {"base": url, "paths": [""]}, max_attempts=1)
    env = provider_env(api={"allow_hosts": [], "max_in_flight": 0})
    worker = workers.run(env=env)
    assert worker.returncode == 0, workers.log(worker)

    calls = Job.objects.filter(operation="test.http_calls")
    assert set(calls.values_list("state", "error_code")) == {("failed", "non_retryable")}
    rows = {row.key: row for row in SecurityEvent.objects.filter(category="ssrf")}
    assert {key: row.count for key, row in rows.items()} == {
        "ssrf-private": 2,
        "ssrf-link-local": 1,
    }
    for row in rows.values():
        assert (row.cwe, row.source, row.severity) == ("CWE-918", "durable.http", "warning")
        assert "provider api" in row.detail
        assert "q-secret-1" not in row.detail  # never the path or the query
