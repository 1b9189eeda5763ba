"""schemathesis fuzzes a live gunicorn from the published OpenAPI document.

Requests are generated from the document — valid ones and, for every
operation, deliberately invalid ones — and each response must be documented
(status, media type, headers) and match its schema; no request may produce a
5xx. The run is bounded: a fixed number of examples per operation.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from durable import jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

EXAMPLES = 50
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


def fuzz(operation, mode: GenerationMode, base_url: str, headers: dict[str, str]) -> int:
    """Send EXAMPLES generated requests for one operation; fail on the first bad response."""
    checks = [*CHECKS, negative_data_rejection] if mode is GenerationMode.NEGATIVE else CHECKS
    calls = 0

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,  # the same requests every run: a failure reproduces
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def exchange(case):
        nonlocal calls
        response = case.call(base_url=base_url, headers=headers, timeout=30)
        calls += 1
        case.validate_response(response, checks=checks, headers=headers)

    exchange()
    return calls


def test_openapi__live_server_conforms_under_generated_requests(live):
    # Jobs to find: ids 1..3 exist, in several states, so GETs and actions hit real rows.
    jobs.enqueue("durable.noop", {})
    jobs.pause(jobs.enqueue("durable.noop", {}).pk)
    jobs.cancel(jobs.enqueue("durable.noop", {}).pk)
    schema = schemathesis.openapi.from_url(f"{live.server.url}/api/openapi.json")
    headers = {"Authorization": f"Bearer {live.token}", "Accept": "application/json"}
    calls = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            calls += fuzz(operation, mode, live.server.url, headers)
    assert calls >= 9 * EXAMPLES  # every operation was exercised
    assert " 500 " not in live.server.log()
