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
from schemathesis.config import SchemathesisConfig
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from durable import jobs
from tests.integration.api.conftest import DOCUMENT
from tests.integration.helpers import drain

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

EXAMPLES = 50
SSE_EXAMPLES = 25
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


# Negative data may also be refused by gunicorn before the application sees it: a
# generated query string longer than its request-line limit gets 414 (documented).
CONFIG = SchemathesisConfig.from_dict(
    {
        "checks": {
            "negative_data_rejection": {
                "expected-statuses": [
                    *("400", "401", "403", "404", "405", "406", "409", "414", "415", "422"),
                    *("428", "429", "5xx"),
                ]
            }
        }
    }
)


def checks_for(case, checks: list) -> list:
    """The checks that apply to ``case`` as it is really sent.

    Our ``headers`` (the client's token) replace the generated ones, so a case whose
    invalid part includes its headers (a missing Authorization) is no longer that
    negative case: whatever else it negated may be a kind the server rightly accepts
    (an unknown query parameter). Every other check still applies to it.
    """
    meta = case.meta
    component = meta.components.get(ParameterLocation.HEADER) if meta is not None else None
    if component is not None and component.mode is GenerationMode.NEGATIVE:
        return [check for check in checks if check is not negative_data_rejection]
    return checks


def fuzz(
    operation,
    mode: GenerationMode,
    base_url: str,
    headers: dict[str, str],
    *,
    examples: int = EXAMPLES,
    job_ids: tuple[int, ...] = (),
) -> int:
    """Send ``examples`` generated requests for one operation; fail on the first bad response.

    ``job_ids``: in positive mode, point the requests at these jobs in turn (random
    ids almost never exist, and a 404 says nothing about a stream's events).
    """
    checks = [*CHECKS, negative_data_rejection] if mode is GenerationMode.NEGATIVE else CHECKS
    calls = 0

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,  # the same requests every run: a failure reproduces
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def exchange(case):
        nonlocal calls
        if job_ids and mode is GenerationMode.POSITIVE:
            case.path_parameters = {**case.path_parameters, "job_id": job_ids[calls % len(job_ids)]}
        response = case.call(base_url=base_url, headers=headers, timeout=30)
        calls += 1
        case.validate_response(response, checks=checks_for(case, checks), headers=headers)

    exchange()
    return calls


def test_openapi__live_server_conforms_under_generated_requests(live):
    # Jobs to find: ids 1..3 exist, in several states, so GETs and actions hit real rows.
    jobs.enqueue("durable.noop", {})
    jobs.pause(jobs.enqueue("durable.noop", {}).pk)
    jobs.cancel(jobs.enqueue("durable.noop", {}).pk)
    schema = schemathesis.openapi.from_url(f"{live.server.url}/api/openapi.json", config=CONFIG)
    headers = {"Authorization": f"Bearer {live.token}", "Accept": "application/json"}
    calls = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            calls += fuzz(operation, mode, live.server.url, headers)
    operations = sum(len(methods) for methods in DOCUMENT["paths"].values())
    assert operations == 16  # jobs (11), schedules (5): the document grew, so did the run
    assert calls >= operations * EXAMPLES  # every operation was exercised
    assert " 500 " not in live.server.log()


def test_openapi__event_streams_conform_under_generated_requests(live_server_factory, make_client):
    """The same, asking for ``text/event-stream``: every SSE event checked against StreamEvent.

    Short streams (the server's time limit), so a queued job's stream ends quickly.
    """
    server = live_server_factory(
        DURABLE_API_STREAM_SECONDS="0.2", DURABLE_API_STREAM_POLL_SECONDS="0.05"
    )
    _, token = make_client("follower", ("jobs:read",))
    job_ids = (
        jobs.enqueue("durable.noop", {}).pk,  # queued: the time limit ends its stream
        drain(jobs.enqueue("test.ticks", {"units": 2}).pk).pk,  # its stream ends with `end`
        jobs.cancel(jobs.enqueue("durable.noop", {}).pk).job_id,
    )
    schema = schemathesis.openapi.from_url(f"{server.url}/api/openapi.json", config=CONFIG)
    operation = schema.find_operation_by_label("GET /api/jobs/{job_id}/events")
    assert operation is not None
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    calls = sum(
        fuzz(operation, mode, server.url, headers, examples=SSE_EXAMPLES, job_ids=job_ids)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    )
    assert calls >= 2 * SSE_EXAMPLES
    assert " 500 " not in server.log()
