"""An API request while the database is unreachable: 503 with Retry-After, not a 500.

In the API's JSON error shape, checked against the OpenAPI document like every
other response, and logged on one line without a traceback. Both databases: the
connection really fails (see ``unreachable_database``).
"""

from __future__ import annotations

import logging

import httpx
import pytest

from durable.api.models import Client as ApiClient
from durable.api.tokens import new_token
from tests.integration.api.conftest import Api, wsgi_handler
from tests.integration.helpers import unreachable_database

# The test's own transaction would be lost with its connection: these tests commit.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def live_api(openapi_schema):
    token = new_token()
    ApiClient.objects.create(
        name="outage",
        scopes=["jobs:read", "jobs:write"],
        token_prefix=token.prefix,
        token_hash=token.hash,
    )
    transport = httpx.WSGITransport(app=wsgi_handler(), remote_addr="192.0.2.7")
    with httpx.Client(transport=transport, base_url="http://testserver") as http:
        yield Api(http, openapi_schema, token.token)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/api/jobs", None),
        ("GET", "/api/jobs/1", None),
        ("POST", "/api/jobs", {"operation": "durable.noop", "input": {"units": 1}}),
        ("GET", "/api/schedules", None),
    ],
)
def test_api__503_with_retry_after_in_the_json_error_shape(live_api, caplog, method, path, body):
    caplog.set_level(logging.INFO)
    with unreachable_database():
        response = live_api.request(method, path, json=body)  # checked against the document
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "5"
    assert response.headers["Content-Type"] == "application/problem+json"
    assert response.headers["Cache-Control"] == "no-store"
    problem = response.json()
    assert (problem["status"], problem["code"]) == (503, "database_unavailable")
    # one line, without a traceback, and not Django's "Internal Server Error"
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in errors] == ["api request failed: database unreachable"]
    assert errors[0].exc_info is None
    # and back
    assert live_api.get("/api/jobs").status_code == 200
