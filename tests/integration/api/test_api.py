"""The API in-process (Django's WSGI handler behind httpx), in the test's transaction.

Every response is also checked against the OpenAPI document (see conftest).
"""

from __future__ import annotations

import hmac
import io
import json
import threading
import warnings
from datetime import timedelta

import httpx
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client as DjangoClient
from django.test import override_settings
from django.utils import timezone

from durable import jobs, signals
from durable.api import tokens, views
from durable.api.models import Client, IdempotencyKey
from durable.models import Job
from durable.operations import Access, get_operation
from recovery.models import SecurityEvent
from recovery.policy import MAX_ACTORS
from tests.integration.api.conftest import component_validator, sse_events
from tests.integration.helpers import drain

pytestmark = pytest.mark.django_db

NOOP = {"operation": "durable.noop", "input": {"units": 2}}


@pytest.fixture
def refusals():
    """Every security_refusal signal sent during the test, as its keyword arguments."""
    seen: list[dict] = []

    def receiver(sender, **kwargs):
        kwargs.pop("signal", None)
        seen.append(kwargs)

    signals.security_refusal.connect(receiver)
    yield seen
    signals.security_refusal.disconnect(receiver)


def submit(api, body=NOOP, *, key=None, **kwargs):
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    headers.update(kwargs.pop("headers", {}))
    # json.dumps escapes non-ASCII, so even an unpaired surrogate can be sent.
    return api.post("/api/jobs", content=json.dumps(body).encode(), headers=headers, **kwargs)


def problem_fields(response) -> list[str]:
    return [error["field"] for error in response.json().get("errors", [])]


# --- authentication -------------------------------------------------------------------


def test_auth__missing_token_is_401_with_a_challenge(api, refusals):
    response = api.get("/api/jobs", token=None)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="durable-api"'
    assert response.json()["code"] == "missing_token"
    assert [r["key"] for r in refusals] == ["missing-token"]


@pytest.mark.parametrize(
    ("header", "key"),
    [
        ("Basic dXNlcjpwYXNz", "malformed-header"),
        ("Bearer", "malformed-header"),
        ("Bearer not-a-token-of-ours", "invalid-token"),
        ("Bearer dur_0123456789ab_" + "A" * 43, "invalid-token"),  # well-formed, unknown prefix
    ],
)
def test_auth__bad_credentials_are_401(api, refusals, header, key):
    response = api.get("/api/jobs", token=None, headers={"Authorization": header})
    assert response.status_code == 401
    assert "error=" in response.headers["WWW-Authenticate"]
    assert [r["key"] for r in refusals] == [key]


def test_auth__right_prefix_wrong_secret_is_401(api, refusals):
    # "dur_<12 hex>_": the secret itself may contain "_", so cut by length, not by "_".
    forged = api.token[: len("dur_0123456789ab_")] + "B" * 43
    assert tokens.token_prefix(forged) == tokens.token_prefix(api.token)
    response = api.get("/api/jobs", token=forged)
    assert response.status_code == 401
    assert refusals[-1]["key"] == "invalid-token"
    assert refusals[-1]["username"] == ""  # not authenticated: no client is named


def test_auth__revoked_token_is_401_and_reported_as_revoked(api, refusals, make_client):
    _, token = make_client("old-ci")
    call_command("revoke_api_client", "old-ci", stdout=io.StringIO())
    response = api.get("/api/jobs", token=token)
    assert response.status_code == 401
    assert response.json()["code"] == "invalid_token"  # the client learns no more than that
    assert (refusals[-1]["key"], refusals[-1]["username"]) == ("revoked-token", "old-ci")


def test_auth__missing_scope_is_403(api, refusals, make_client):
    _, reader = make_client("reader", ("jobs:read",))
    _, writer = make_client("writer", ("jobs:write",))
    assert api.get("/api/jobs", token=reader).status_code == 200
    refused = submit(api, token=reader)
    assert refused.status_code == 403
    assert 'error="insufficient_scope", scope="jobs:write"' in refused.headers["WWW-Authenticate"]
    assert api.get("/api/jobs", token=writer).status_code == 403
    job = jobs.enqueue("durable.noop", {})
    assert api.post(f"/api/jobs/{job.pk}/cancel", token=reader).status_code == 403
    assert [(r["key"], r["username"]) for r in refusals] == [
        ("insufficient-scope", "reader"),
        ("insufficient-scope", "writer"),
        ("insufficient-scope", "reader"),
    ]
    assert not Job.objects.exclude(pk=job.pk).exists()
    assert Job.objects.get(pk=job.pk).state == "queued"


def test_auth__refusals_name_the_kind_of_problem_never_the_token(api, refusals):
    """Brute force adds to one Security row's count: the identity fields never vary."""
    guesses = [f"dur_{i:012x}_{'x' * 43}" for i in range(30)] + [f"guess{i}" for i in range(30)]
    for guess in guesses:
        assert api.get("/api/jobs", token=guess).status_code == 401
    identities = {
        (r["category"], r["key"], r["detail"], r["source"], r["severity"], r["cwe"])
        for r in refusals
    }
    assert identities == {
        ("api-auth", "invalid-token", "the bearer token is not valid", "api", "warning", "CWE-287")
    }
    assert {r["ip"] for r in refusals} == {"192.0.2.7"}  # the remote address is the actor
    text = json.dumps(refusals)
    assert not any(guess in text for guess in guesses)


def test_auth__guesses_become_one_security_row_with_a_count_and_the_address(api):
    """What the signal becomes: the Security report's summary row, not N rows."""
    for index in range(25):
        assert api.get("/api/jobs", token=f"dur_{index:012x}_{'x' * 43}").status_code == 401
    row = SecurityEvent.objects.get()
    assert (row.category, row.key, row.source, row.cwe) == (
        "api-auth", "invalid-token", "api", "CWE-287",
    )  # fmt: skip
    assert row.count == 25
    assert row.addresses == {"192.0.2.7": 25}
    assert (row.addresses_overflow, row.last_ipv4) == (0, "192.0.2.7")


@override_settings(TRUSTED_PROXY_COUNT=1)
def test_auth__the_security_tally_stays_bounded_when_the_address_varies(api):
    # Behind one trusted proxy the client is the last X-Forwarded-For entry, so
    # each request comes "from" another address; the tally keeps MAX_ACTORS of them.
    guesses = MAX_ACTORS + 15
    for index in range(guesses):
        forwarded = {"X-Forwarded-For": f"6.6.6.6, 203.0.{index // 250}.{index % 250 + 1}"}
        assert api.get("/api/jobs", token="guess", headers=forwarded).status_code == 401
    row = SecurityEvent.objects.get()
    assert row.count == guesses
    assert len(row.addresses) == MAX_ACTORS
    assert row.addresses_overflow == 15
    assert "6.6.6.6" not in row.addresses  # written by the client, not by our proxy
    assert "192.0.2.7" not in row.addresses  # the proxy itself is not the client


def test_auth__x_forwarded_for_is_ignored_without_trusted_proxies(api, refusals):
    api.get("/api/jobs", token=None, headers={"X-Forwarded-For": "203.0.113.9"})
    assert refusals[-1]["ip"] == "192.0.2.7"  # TRUSTED_PROXY_COUNT = 0: the TCP peer


def test_auth__every_token_is_compared_in_constant_time(api, monkeypatch):
    """Each path — right token, right prefix wrong secret, unknown prefix, no prefix —
    compares one SHA-256 with hmac.compare_digest, never with ``==``."""
    calls: list[tuple[str, str]] = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(tokens.hmac, "compare_digest", spy)
    stored = Client.objects.get(name="ci").token_hash
    forged = api.token[: len("dur_0123456789ab_")] + "B" * 43  # the secret may hold "_"
    unknown = "dur_0123456789ab_" + "A" * 43
    cases = [(api.token, stored, 200), (forged, stored, 401), (unknown, tokens._DUMMY_HASH, 401)]
    cases.append(("not-a-token", tokens._DUMMY_HASH, 401))
    for token, against, status in cases:
        calls.clear()
        assert api.get("/api/jobs", token=token).status_code == status
        assert calls == [(tokens.hash_token(token), against)]


def test_openapi_document__is_public_and_lists_every_path(api):
    response = api.get("/api/openapi.json", token=None)
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.1")
    assert set(document["paths"]) == {
        "/api/jobs", "/api/jobs/batch", "/api/jobs/{job_id}", "/api/jobs/{job_id}/events",
        "/api/openapi.json",
        "/api/jobs/{job_id}/cancel", "/api/jobs/{job_id}/pause", "/api/jobs/{job_id}/resume",
        "/api/jobs/{job_id}/retry", "/api/schedules", "/api/schedules/{schedule_id}",
        "/api/jobs/{job_id}/result",
    }  # fmt: skip


# --- submission ---------------------------------------------------------------------------


def test_submit__202_with_location_and_the_job(api):
    response = submit(
        api,
        {
            "operation": "durable.noop",
            "input": {"units": 3},
            "queue": "bulk",
            "priority": 7,
            "on_restart": "fail",
        },
    )
    assert response.status_code == 202
    body = response.json()
    assert response.headers["Location"] == f"/api/jobs/{body['id']}" == body["url"]
    assert "Idempotent-Replayed" not in response.headers  # no key, nothing to replay
    job = Job.objects.get(pk=body["id"])
    assert (job.operation, job.queue, job.priority, job.on_restart, job.owner) == (
        "durable.noop", "bulk", 7, "fail", "api:ci",
    )  # fmt: skip
    assert body["state"] == "queued"
    assert body["input"] == {"units": 3, "sleep": 0}  # as the operation normalised it
    assert list(job.events.values_list("kind", flat=True)) == ["enqueued"]


@pytest.mark.parametrize(
    ("body", "bad"),
    [
        ({"input": {}}, ["operation"]),
        ({"operation": "durable.noop", "priority": 1000}, ["priority"]),
        ({"operation": "durable.noop", "priority": True}, ["priority"]),
        ({"operation": "durable.noop", "on_restart": "later"}, ["on_restart"]),
        ({"operation": "durable.noop", "queue": "a b"}, ["queue"]),
        ({"operation": "durable.noop", "unique_key": "x"}, ["unique_key"]),
        ({"operation": "durable.noop", "input": {"units": "many"}}, ["input.units"]),
        ({"operation": "durable.noop", "input": {"api_key": "abc12345"}}, ["input.api_key"]),
        ({"operation": "durable.noop", "input": {"x": "Bearer abcdefghijkl"}}, ["input.x"]),
        ({"operation": "durable.noop", "input": {"note": "a\u0000b"}}, ["input.note"]),
        ({"operation": "durable.noop", "input": {"note": "\ud83d"}}, ["input.note"]),
        ({"operation": "durable.noop", "input": 5}, ["input"]),
    ],
)
def test_submit__invalid_fields_are_400_with_field_errors(api, body, bad):
    response = submit(api, body)
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"
    assert problem_fields(response) == bad
    assert not Job.objects.exists()


def test_submit__unknown_operation_is_400(api, settings):
    response = submit(api, {"operation": "no.such.thing"})
    assert response.status_code == 400
    assert problem_fields(response) == ["operation"]
    settings.DURABLE_API_OPERATIONS = ["test.rows"]
    # Registered, but not offered to API clients: the same answer.
    assert problem_fields(submit(api, NOOP)) == ["operation"]
    assert submit(api, {"operation": "test.rows"}).status_code == 202
    assert list(Job.objects.values_list("operation", flat=True)) == ["test.rows"]


# --- who may start what -------------------------------------------------------------------


def force_access(monkeypatch, name: str, access: str) -> None:
    monkeypatch.setattr(type(get_operation(name)), "access", access)


def test_submit__a_system_operation_is_never_started_through_the_api(
    api, make_client, monkeypatch, refusals
):
    force_access(monkeypatch, "test.rows", Access.SYSTEM)  # as the site's deliveries are
    _, admin = make_client("ops", ("jobs:write", "jobs:admin"))
    for token in (api.token, admin):
        refused = submit(api, {"operation": "test.rows"}, token=token, key="k")
        assert refused.status_code == 403
        assert refused.json()["code"] == "operation_not_allowed"
        assert "started by the site itself" in refused.json()["detail"]
        assert "WWW-Authenticate" not in refused.headers  # no token would help
    assert not Job.objects.exists()
    assert not IdempotencyKey.objects.exists()
    assert [(r["key"], r["username"]) for r in refusals] == [
        ("operation-not-allowed", "ci"), ("operation-not-allowed", "ops"),
    ]  # fmt: skip


def test_submit__a_privileged_operation_needs_jobs_admin(api, make_client, refusals):
    body = {"operation": "test.one_per_target", "input": {"target": "a"}}
    refused = submit(api, body, key="restore-a")
    assert refused.status_code == 403
    assert refused.json()["code"] == "insufficient_scope"
    assert "privileged operation" in refused.json()["detail"]
    assert 'scope="jobs:admin"' in refused.headers["WWW-Authenticate"]
    assert refusals[-1]["key"] == "insufficient-scope"
    assert not IdempotencyKey.objects.exists()  # the refusal did not use the key up
    _, admin_only = make_client("admin-only", ("jobs:admin",))
    assert submit(api, body, token=admin_only).status_code == 403  # jobs:write is needed too
    _, admin = make_client("ops", ("jobs:write", "jobs:admin"))
    accepted = submit(api, body, token=admin, key="restore-a")
    assert accepted.status_code == 202
    assert Job.objects.get().owner == "api:ops"


def test_submit__the_allow_list_still_applies_to_admins(api, make_client, settings):
    settings.DURABLE_API_OPERATIONS = ["durable.noop"]
    _, admin = make_client("ops", ("jobs:write", "jobs:admin"))
    body = {"operation": "test.one_per_target", "input": {"target": "a"}}
    assert problem_fields(submit(api, body, token=admin)) == ["operation"]  # 400: not offered


@pytest.fixture
def builtin_setup(settings, tmp_path):
    """What the built-in operations need to accept an input: directories and storages."""
    settings.DURABLE_BACKUP_DIR = tmp_path / "backups"
    (settings.DURABLE_BACKUP_DIR / "nightly").mkdir(parents=True)  # restore names it
    imports = tmp_path / "imports"
    imports.mkdir()
    (imports / "events.jsonl").write_text('{"type": "backup-created"}\n')
    (imports / "events.csv").write_text("type,detail\nbackup-created,x\n")
    settings.RECOVERY_IMPORT_DIRS = [str(imports)]
    for name in ("src", "dst"):
        (tmp_path / name).mkdir()
    settings.STORAGES = {
        **settings.STORAGES,
        **{
            name: {
                "BACKEND": "django.core.files.storage.FileSystemStorage",
                "OPTIONS": {"location": str(tmp_path / name)},
            }
            for name in ("src", "dst")
        },
    }
    return imports


# (operation, input sent, what the job's input must contain)
BUILTIN = [
    ("backup.database", {"name": "api-backup"}, {"name": "api-backup", "database": "default"}),
    ("integrity.scan", {"storage": "scan"}, {"target": "storage", "storage": "scan"}),
    ("restore.database", {"name": "nightly"}, {"name": "nightly", "database": "default",
                                               "replace": False}),
    ("db.copy", {"target": "other"}, {"source": "default", "target": "other", "replace": False}),
    ("files.move", {"source": "src", "destination": "dst"}, {"source": "src",
                                                             "destination": "dst"}),
    ("import.jsonl", {"path": "{imports}/events.jsonl"}, {"path": "{imports}/events.jsonl"}),
    ("import.csv", {"path": "{imports}/events.csv"}, {"path": "{imports}/events.csv"}),
    ("durable.purge", {"older_than": "30d"}, {}),
]  # fmt: skip


def _fill(value: dict, imports) -> dict:
    return {k: v.format(imports=imports) if isinstance(v, str) else v for k, v in value.items()}


def _accepted_input(api, token, name, sent, expected) -> None:
    response = submit(api, {"operation": name, "input": sent}, token=token)
    assert response.status_code == 202, response.text
    job = Job.objects.get(pk=response.json()["id"])
    assert job.operation == name
    assert expected.items() <= job.input.items(), job.input
    assert response.json()["input"] == job.input


@pytest.mark.parametrize(("name", "sent", "expected"), BUILTIN, ids=[b[0] for b in BUILTIN])
def test_builtin_operations__start_from_the_api_under_their_declared_access(
    api, make_client, builtin_setup, name, sent, expected
):
    sent, expected = _fill(sent, builtin_setup), _fill(expected, builtin_setup)
    access = get_operation(name).access
    assert access != Access.SYSTEM  # every one of them is meant to be started by hand
    _, admin = make_client("ops", ("jobs:write", "jobs:admin"))
    if access == Access.PRIVILEGED:
        refused = submit(api, {"operation": name, "input": sent})
        assert refused.status_code == 403
        assert refused.json()["code"] == "insufficient_scope"
        _accepted_input(api, admin, name, sent, expected)
    else:
        _accepted_input(api, api.token, name, sent, expected)


@pytest.mark.parametrize(("name", "sent", "expected"), BUILTIN, ids=[b[0] for b in BUILTIN])
def test_builtin_operations__as_privileged_need_jobs_admin(
    api, make_client, builtin_setup, monkeypatch, name, sent, expected
):
    # Whatever an operation declares today, the API enforces PRIVILEGED for each one.
    force_access(monkeypatch, name, Access.PRIVILEGED)
    sent, expected = _fill(sent, builtin_setup), _fill(expected, builtin_setup)
    refused = submit(api, {"operation": name, "input": sent})
    assert refused.status_code == 403
    assert not Job.objects.exists()
    _, admin = make_client("ops", ("jobs:write", "jobs:admin"))
    _accepted_input(api, admin, name, sent, expected)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"", "empty"),
        (b'{"operation": "durable.noop",', "not valid JSON"),
        (b'["durable.noop"]', "must be a JSON object"),
        (b'{"operation": "durable.noop", "operation": "test.rows"}', "duplicate key"),
        (b'{"operation": "durable.noop", "input": {"units": NaN}}', "not valid JSON"),
        (b'{"operation": "\xc3\x28"}', "not UTF-8"),
        (b"[" * 50_000 + b"]" * 50_000, "nested too deeply"),
    ],
)
def test_submit__malformed_json_is_400(api, content, why):
    response = api.post("/api/jobs", content=content, headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["code"] == "malformed_json"
    assert why in response.json()["detail"]
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin-1"],
)
def test_submit__wrong_content_type_is_415(api, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    response = api.post("/api/jobs", content=json.dumps(NOOP).encode(), headers=headers)
    assert response.status_code == 415
    assert not Job.objects.exists()


def test_submit__oversized_body_is_413_before_it_is_parsed(api, settings):
    settings.DURABLE_API_MAX_BODY_BYTES = 1000
    big = {"operation": "durable.noop", "input": {"pad": "x" * 1000}}
    response = submit(api, big)
    assert response.status_code == 413
    assert "1000 bytes (DURABLE_API_MAX_BODY_BYTES)" in response.json()["detail"]
    assert not Job.objects.exists()
    fits = {"operation": "durable.noop", "input": {"units": 1, "pad": "x" * 900}}
    assert len(json.dumps(fits)) < 1000
    assert submit(api, fits).status_code == 202  # just under the limit


def test_submit__the_api_limit_applies_not_djangos_upload_limit(api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000  # below the API's own limit
    settings.DURABLE_API_MAX_BODY_BYTES = 5000
    fits = {"operation": "durable.noop", "input": {"units": 1, "pad": "x" * 2000}}
    assert submit(api, fits).status_code == 202
    big = {"operation": "durable.noop", "input": {"pad": "x" * 6000}}
    refused = submit(api, big)
    assert refused.status_code == 413
    assert "5000 bytes (DURABLE_API_MAX_BODY_BYTES)" in refused.json()["detail"]


def test_submit__a_chunked_body_is_411_not_empty(api):
    chunks = iter([json.dumps(NOOP).encode()])  # httpx sends an iterator chunked
    response = api.post("/api/jobs", content=chunks, headers={"Content-Type": "application/json"})
    assert response.status_code == 411
    assert response.json()["code"] == "length_required"
    assert "Content-Length" in response.json()["detail"]
    assert not Job.objects.exists()


def test_submit__input_over_the_engine_limit_is_400_on_input(api, settings):
    settings.DURABLE_MAX_INPUT_BYTES = 100
    response = submit(api, {"operation": "test.rows", "input": {"pad": "x" * 200}})
    assert response.status_code == 400
    assert problem_fields(response) == ["input"]


def test_views__are_csrf_exempt_and_never_touch_sessions(make_client):
    _, token = make_client("browserless")
    browser = DjangoClient(enforce_csrf_checks=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "No directory at", UserWarning)  # see wsgi_handler
        response = browser.post(
            "/api/jobs", NOOP, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
        )
    assert response.status_code == 202
    assert not response.cookies
    assert "Cookie" not in response.get("Vary", "")
    assert response["Cache-Control"] == "no-store"


@pytest.mark.django_db(transaction=True)  # another connection must see the commit
def test_submit__commits_before_the_view_answers_even_under_atomic_requests(api, monkeypatch):
    """With ATOMIC_REQUESTS the site wraps every view in a transaction that commits only
    after the view returns. The API opts out: the job is visible from another
    connection the moment ``submit`` hands back the 202, before the view returns."""
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    seen: list[bool] = []
    real_submit = views.submit

    def submit_then_look(client, submission, **kwargs):
        reply = real_submit(client, submission, **kwargs)
        job_id = json.loads(reply.body)["id"]
        race(1, lambda: seen.append(Job.objects.filter(pk=job_id).exists()))
        return reply

    monkeypatch.setattr(views, "submit", submit_then_look)
    assert submit(api, key="k").status_code == 202
    assert submit(api).status_code == 202
    assert seen == [True, True]


# --- idempotency ----------------------------------------------------------------------------


def test_idempotency__same_key_and_body_replays_the_first_response(api):
    first = submit(api, key="deploy-42")
    # Same JSON, other formatting and key order: the same request.
    again = api.post(
        "/api/jobs",
        content=b'{ "input" : {"units":2},\n "operation":"durable.noop" }',
        headers={"Content-Type": "application/json", "Idempotency-Key": '"deploy-42"'},
    )
    assert first.status_code == again.status_code == 202
    assert again.content == first.content
    assert again.headers["Location"] == first.headers["Location"]
    assert (first.headers["Idempotent-Replayed"], again.headers["Idempotent-Replayed"]) == (
        "false", "true",
    )  # fmt: skip
    assert Job.objects.count() == 1
    assert IdempotencyKey.objects.get().job_id == first.json()["id"]


@pytest.mark.parametrize(
    ("first", "again"),
    [
        ({"input": {"units": 2}}, {"input": {"units": 2.0}}),  # one JSON number
        ({}, {"input": {}}),
        ({}, {"input": None}),
        ({}, {"priority": None, "queue": None, "on_restart": None}),
        ({}, {"priority": 0, "queue": "default", "on_restart": "resume"}),  # noop's own
        ({"priority": 3}, {"priority": 3.0}),
    ],
)
def test_idempotency__equivalent_requests_replay(api, first, again):
    one = submit(api, {"operation": "durable.noop", **first}, key="same")
    other = submit(api, {"operation": "durable.noop", **again}, key="same")
    assert (one.status_code, other.status_code) == (202, 202), other.text
    assert other.headers["Idempotent-Replayed"] == "true"
    assert other.content == one.content
    assert Job.objects.count() == 1


def test_submit__a_whole_float_priority_is_that_integer(api):
    response = submit(api, {"operation": "durable.noop", "priority": 7.0})
    assert response.status_code == 202
    assert Job.objects.get().priority == 7
    assert problem_fields(submit(api, {"operation": "durable.noop", "priority": 7.5})) == [
        "priority"
    ]


def test_idempotency__same_key_other_body_is_422(api):
    first = submit(api, key="k1")
    other = submit(api, {"operation": "durable.noop", "input": {"units": 3}}, key="k1")
    assert other.status_code == 422
    assert other.json()["code"] == "idempotency_key_reused"
    assert Job.objects.count() == 1
    assert submit(api, key="k1").json()["id"] == first.json()["id"]  # still replays


def test_idempotency__keys_are_scoped_to_the_client(api, make_client):
    _, other = make_client("other-ci")
    mine = submit(api, key="shared-name")
    theirs = submit(api, key="shared-name", token=other)
    assert mine.status_code == theirs.status_code == 202
    assert mine.json()["id"] != theirs.json()["id"]
    assert theirs.json()["owner"] == "api:other-ci"


def test_idempotency__a_refused_request_does_not_use_up_the_key(api):
    refused = submit(api, {"operation": "durable.noop", "priority": 999}, key="k2")
    assert refused.status_code == 400
    assert not IdempotencyKey.objects.exists()
    assert submit(api, key="k2").status_code == 202


@pytest.mark.parametrize("key", ["", "x" * 256, "with space", "tab\tkey"])
def test_idempotency__unusable_key_is_400(api, key):
    response = api.post(
        "/api/jobs",
        content=json.dumps(NOOP).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": key},
    )
    assert response.status_code == 400
    assert problem_fields(response) == ["header.Idempotency-Key"]
    assert not Job.objects.exists()


def race(count: int, action) -> list:
    """Run ``action`` in ``count`` threads released at once; each closes its connection."""
    start = threading.Barrier(count)
    results: list = []
    errors: list[BaseException] = []

    def run():
        try:
            start.wait(timeout=10)
            results.append(action())
        except BaseException as exc:  # reported below, with the thread's traceback
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    return results


@pytest.mark.django_db(transaction=True)  # eight threads, eight connections: rows must commit
def test_idempotency__eight_concurrent_duplicates_make_one_job(api):
    for round_ in range(3):
        key = f"race-{round_}"
        results: list[httpx.Response] = race(8, lambda key=key: submit(api, key=key))
        assert [r.status_code for r in results] == [202] * 8
        assert len({r.json()["id"] for r in results}) == 1
        assert len({r.content for r in results}) == 1
        assert sorted(r.headers["Idempotent-Replayed"] for r in results) == ["false"] + ["true"] * 7
    assert Job.objects.count() == 3
    assert IdempotencyKey.objects.count() == 3


# --- reading jobs and events ---------------------------------------------------------------


def test_get_job__state_progress_and_last_error(api):
    job = jobs.enqueue("test.flaky", {"fail_times": 5, "message": "provider down"})
    drain(job.pk)
    body = api.get(f"/api/jobs/{job.pk}").json()
    assert (body["state"], body["finished"], body["attempts"]) == ("failed", True, 3)
    assert body["last_error"]["message"] == "provider down"
    assert "traceback" not in body["last_error"]  # tracebacks stay on the dashboard
    done = drain(jobs.enqueue("test.rows", {"units": 2}).pk)
    body = api.get(f"/api/jobs/{done.pk}").json()
    assert body["progress"] == {"units_done": 2, "units_total": 2, "fraction": 1.0}
    assert body["checkpoint"] == {"next": 2}
    assert body["started_at"] is not None
    assert body["finished_at"] is not None


@pytest.mark.parametrize(
    "path",
    [
        "/api/jobs/999",
        "/api/jobs/0",
        "/api/jobs/99999999999999999999999",  # larger than BIGINT: never reaches the database
        "/api/jobs/abc",
        "/api/jobs/1/events/extra",
        "/api/jobs/1/explode",  # no such action
        "/api/nothing",
        "/api/jobs/a%0Ab%0Dc",  # line breaks: "." in a URL pattern misses them
    ],
)
def test_unknown_resources_are_json_404s(api, path):
    method = "POST" if path.endswith("explode") else "GET"
    response = api.request(method, path)
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"


def test_wrong_method_is_405_with_allow(api):
    job = jobs.enqueue("durable.noop", {})
    response = api.request("DELETE", f"/api/jobs/{job.pk}")
    assert response.status_code == 405
    assert response.headers["Allow"] == "GET"
    assert api.request("PUT", "/api/jobs").headers["Allow"] == "GET, POST"
    assert api.get(f"/api/jobs/{job.pk}/cancel").status_code == 405


def test_events__json_pages_in_seq_order(api):
    job = drain(jobs.enqueue("test.ticks", {"units": 4}).pk)
    kinds = list(job.events.order_by("seq").values_list("kind", flat=True))
    assert len(kinds) == 7  # enqueued, started, 4 ticks, completed
    page = api.get(f"/api/jobs/{job.pk}/events", params={"limit": 3}).json()
    assert [e["seq"] for e in page["events"]] == [1, 2, 3]
    assert (page["next_after"], page["has_more"], page["finished"]) == (3, True, True)
    page = api.get(f"/api/jobs/{job.pk}/events", params={"after": 3, "limit": 4}).json()
    assert [e["seq"] for e in page["events"]] == [4, 5, 6, 7]
    assert page["has_more"] is False  # exactly the rest: no empty extra page
    assert page["events"][-1]["kind"] == "completed"
    page = api.get(f"/api/jobs/{job.pk}/events", params={"after": 7}).json()
    assert (page["events"], page["next_after"], page["has_more"]) == ([], 7, False)
    # Last-Event-ID (a reconnecting client) wins over the after it started with.
    page = api.get(
        f"/api/jobs/{job.pk}/events", params={"after": 1}, headers={"Last-Event-ID": "6"}
    ).json()
    assert [e["seq"] for e in page["events"]] == [7]


@pytest.mark.parametrize(
    ("params", "headers"),
    [
        ({"after": "-1"}, {}),
        ({"after": "one"}, {}),
        ({"limit": "0"}, {}),
        ({"from": "1"}, {}),
        ({}, {"Last-Event-ID": "x"}),
    ],
)
def test_events__bad_parameters_are_400(api, params, headers):
    job = jobs.enqueue("durable.noop", {})
    response = api.get(f"/api/jobs/{job.pk}/events", params=params, headers=headers)
    assert response.status_code == 400


def parse_sse(text: str) -> list[dict]:
    frames = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        frame: dict = {}
        for line in block.split("\n"):
            name, _, value = line.partition(": ")
            frame.setdefault(name, value)
        frames.append(frame)
    return frames


SSE = {"Accept": "text/event-stream"}


def test_events_stream__sends_every_event_then_end_for_a_finished_job(api):
    job = drain(jobs.enqueue("test.ticks", {"units": 2}).pk)
    response = api.get(f"/api/jobs/{job.pk}/events", headers=SSE)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    frames = parse_sse(response.text)
    assert frames[0] == {"retry": "2000"}
    assert [int(f["id"]) for f in frames if "id" in f] == [1, 2, 3, 4, 5]
    assert json.loads(frames[3]["data"])["kind"] == "tick"
    assert frames[-1]["event"] == "end"
    assert json.loads(frames[-1]["data"]) == {"state": "completed", "last_event_seq": 5}


def test_events_stream__the_last_batch_and_the_time_limit_together_still_end(api, settings):
    # The time is up right after the first look, which sends every event of a finished
    # job: the stream must still say "end" (a reconnect would get 204, never the end).
    settings.DURABLE_API_STREAM_SECONDS = 0
    job = drain(jobs.enqueue("test.ticks", {"units": 2}).pk)
    frames = parse_sse(api.get(f"/api/jobs/{job.pk}/events", headers=SSE).text)
    assert [int(f["id"]) for f in frames if "id" in f] == [1, 2, 3, 4, 5]
    assert frames[-1]["event"] == "end"


def test_events_stream__resumes_after_last_event_id_and_204_when_nothing_follows(api):
    job = drain(jobs.enqueue("test.ticks", {"units": 2}).pk)
    response = api.get(f"/api/jobs/{job.pk}/events", headers={**SSE, "Last-Event-ID": "3"})
    assert [int(f["id"]) for f in parse_sse(response.text) if "id" in f] == [4, 5]
    done = api.get(f"/api/jobs/{job.pk}/events", headers={**SSE, "Last-Event-ID": "5"})
    assert done.status_code == 204  # EventSource stops reconnecting on 204
    assert done.content == b""


STREAM_EVENT = component_validator("StreamEvent")
STREAM_DATA = {"message": component_validator("JobEvent"), "end": component_validator("StreamEnd")}


def validated_events(response) -> list[dict]:
    """The response's SSE events, each checked against StreamEvent and its data's schema."""
    events = sse_events(response.text)
    for event in events:
        STREAM_EVENT.validate(event)
        STREAM_DATA[event["event"]].validate(json.loads(event["data"]))
    return events


def test_events_stream__every_event_matches_the_documented_stream_event(api, settings):
    settings.DURABLE_API_STREAM_SECONDS = 0.3
    settings.DURABLE_API_STREAM_POLL_SECONDS = 0.05
    finished = drain(jobs.enqueue("test.ticks", {"units": 3}).pk)
    events = validated_events(api.get(f"/api/jobs/{finished.pk}/events", headers=SSE))
    assert [e["event"] for e in events] == ["message"] * 6 + ["end"]
    assert events[-1]["id"] == "6"  # the end event carries the last id seen, per SSE
    resumed = validated_events(
        api.get(f"/api/jobs/{finished.pk}/events", headers={**SSE, "Last-Event-ID": "4"})
    )
    assert [e.get("id") for e in resumed] == ["5", "6", "6"]
    queued = jobs.enqueue("durable.noop", {})  # cut by the time limit: no end event
    events = validated_events(api.get(f"/api/jobs/{queued.pk}/events", headers=SSE))
    assert [(e["event"], e["id"]) for e in events] == [("message", "1")]
    # The validators do refuse what the document does not describe.
    for wrong in (
        {"event": "message", "data": "{}"},  # no id
        {"event": "tick", "id": "1", "data": "{}"},  # an undocumented type
        {"event": "end", "id": "1", "data": "{}", "retry": "5"},
    ):
        assert not STREAM_EVENT.is_valid(wrong)
    assert not STREAM_DATA["end"].is_valid({"state": "queued", "last_event_seq": 1})


def test_events_stream__ends_at_the_time_limit_with_keepalives(api, settings):
    settings.DURABLE_API_STREAM_SECONDS = 0.6
    settings.DURABLE_API_STREAM_POLL_SECONDS = 0.05
    settings.DURABLE_API_STREAM_KEEPALIVE_SECONDS = 0.2
    job = jobs.enqueue("durable.noop", {})  # queued: nobody runs it here
    response = api.get(f"/api/jobs/{job.pk}/events", headers=SSE)
    frames = parse_sse(response.text)
    assert [int(f["id"]) for f in frames if "id" in f] == [1]
    comments = [f[":"] if ":" in f else f.get("", "") for f in frames]
    assert any("keep-alive" in c for c in comments), frames
    assert "reconnect with Last-Event-ID" in response.text
    assert not any(f.get("event") == "end" for f in frames)


# --- actions ----------------------------------------------------------------------------------


MINE = "api:ci"  # the owner POST /jobs records for the ``api`` fixture's client


def test_actions__apply_then_acknowledge_then_refuse(api):
    job = jobs.enqueue("durable.noop", {}, owner=MINE)
    paused = api.post(f"/api/jobs/{job.pk}/pause")
    assert paused.status_code == 200
    assert (paused.json()["applied"], paused.json()["job"]["state"]) == (True, "paused")
    again = api.post(f"/api/jobs/{job.pk}/pause")
    assert (again.status_code, again.json()["applied"]) == (200, False)  # already so
    resumed = api.post(f"/api/jobs/{job.pk}/resume")
    assert resumed.json()["job"]["state"] == "queued"
    cancelled = api.post(f"/api/jobs/{job.pk}/cancel")
    assert cancelled.json()["job"]["state"] == "cancelled"
    refused = api.post(f"/api/jobs/{job.pk}/resume")
    assert refused.status_code == 409
    assert refused.json()["code"] == "transition_refused"
    assert refused.json()["state"] == "cancelled"
    assert "cannot be resumed" in refused.json()["detail"]
    kinds = list(Job.objects.get(pk=job.pk).events.values_list("kind", "data__actor"))
    assert kinds[1:] == [("paused", "api:ci"), ("resumed", "api:ci"), ("cancelled", "api:ci")]


def test_actions__retry_a_failed_job(api):
    job = drain(jobs.enqueue("test.flaky", {"fail_times": 9}, owner=MINE).pk)
    assert job.state == "failed"
    response = api.post(f"/api/jobs/{job.pk}/retry")
    assert response.status_code == 200
    assert (response.json()["job"]["state"], response.json()["job"]["attempts"]) == ("queued", 0)
    completed = drain(jobs.enqueue("durable.noop", {}, owner=MINE).pk)
    assert api.post(f"/api/jobs/{completed.pk}/retry").status_code == 409
    assert api.post(f"/api/jobs/{completed.pk}/cancel").status_code == 409


def test_actions__on_another_clients_job_need_jobs_admin(api, make_client, refusals):
    theirs = submit(api, token=make_client("other-ci")[1]).json()["id"]
    site_job = jobs.enqueue("durable.noop", {}, owner="schedule:nightly").pk
    for job_id in (theirs, site_job):
        for action in ("cancel", "pause", "resume", "retry"):
            refused = api.post(f"/api/jobs/{job_id}/{action}")
            assert refused.status_code == 403
            assert refused.json()["code"] == "insufficient_scope"
            assert "not submitted by this client" in refused.json()["detail"]
            assert 'scope="jobs:admin"' in refused.headers["WWW-Authenticate"]
    assert set(Job.objects.values_list("state", flat=True)) == {"queued"}
    assert {(r["key"], r["username"]) for r in refusals} == {("insufficient-scope", "ci")}
    _, admin = make_client("ops", ("jobs:write", "jobs:admin"))
    assert api.post(f"/api/jobs/{theirs}/pause", token=admin).status_code == 200
    assert api.post(f"/api/jobs/{site_job}/cancel", token=admin).status_code == 200
    kinds = Job.objects.get(pk=theirs).events.values_list("kind", "data__actor")
    assert list(kinds)[-1] == ("paused", "api:ops")
    # Its own job: jobs:write is enough.
    mine = submit(api).json()["id"]
    assert api.post(f"/api/jobs/{mine}/cancel").status_code == 200


def test_actions__unknown_job_is_404(api):
    for action in ("cancel", "pause", "resume", "retry"):
        assert api.post(f"/api/jobs/424242/{action}").status_code == 404
    assert api.post("/api/jobs/99999999999999999999999/cancel").status_code == 404


# --- listing -------------------------------------------------------------------------------


def ids(page) -> list[int]:
    return [job["id"] for job in page.json()["jobs"]]


def test_list__keyset_pages_newest_first_to_the_end(api):
    created = [jobs.enqueue("durable.noop", {}).pk for _ in range(5)]
    first = api.get("/api/jobs", params={"limit": 2})
    assert ids(first) == created[:-3:-1]
    cursor = first.json()["next_cursor"]
    jobs.enqueue("durable.noop", {})  # a new job does not shift the pages already handed out
    second = api.get("/api/jobs", params={"limit": 2, "cursor": cursor})
    assert ids(second) == [created[2], created[1]]
    assert second.json()["next"].startswith("/api/jobs?")
    third = api.get(second.json()["next"])
    assert ids(third) == [created[0]]
    assert (third.json()["next_cursor"], third.json()["next"]) == (None, None)


def test_list__a_full_last_page_has_no_next(api):
    created = [jobs.enqueue("durable.noop", {}).pk for _ in range(2)]
    page = api.get("/api/jobs", params={"limit": 2})
    assert ids(page) == created[::-1]
    assert page.json()["next_cursor"] is None


def test_list__empty(api):
    assert api.get("/api/jobs").json() == {"jobs": [], "next_cursor": None, "next": None}


def test_list__filters_by_state_and_operation(api):
    noop = jobs.enqueue("durable.noop", {})
    rows = jobs.enqueue("test.rows", {})
    paused = jobs.enqueue("test.rows", {})
    jobs.pause(paused.pk)
    assert ids(api.get("/api/jobs", params={"operation": "test.rows"})) == [paused.pk, rows.pk]
    assert ids(api.get("/api/jobs", params={"state": "paused"})) == [paused.pk]
    both = api.get("/api/jobs", params={"state": "paused,queued", "operation": "test.rows"})
    assert ids(both) == [paused.pk, rows.pk]
    assert ids(api.get("/api/jobs", params=[("state", "queued")])) == [rows.pk, noop.pk]
    assert ids(api.get("/api/jobs", params={"operation": "none"})) == []


def test_list__empty_filters_are_no_filters(api):
    created = [jobs.enqueue("durable.noop", {}).pk for _ in range(3)]
    everything = api.get("/api/jobs?state=&operation=&cursor=")  # the issue's own example
    assert everything.status_code == 200
    assert ids(everything) == created[::-1]
    assert ids(api.get("/api/jobs?cursor=")) == created[::-1]
    assert ids(api.get("/api/jobs?state=&state=queued&limit=2")) == created[:0:-1]


@pytest.mark.parametrize(
    "params",
    [
        {"state": "done"},
        {"limit": "500"},
        {"limit": "x"},
        {"cursor": "garbage!"},
        {"cursor": "djI6NQ"},
        {"sort": "id"},
        {"operation": "a\x00b"},
        [("limit", "1"), ("limit", "2")],
    ],
)
def test_list__bad_parameters_are_400_with_the_reason(api, params):
    response = api.get("/api/jobs", params=params)
    assert response.status_code == 400
    assert response.json()["errors"][0]["message"]


# --- retention -----------------------------------------------------------------------------


def test_retention__purges_old_keys_but_never_those_of_unfinished_jobs(api):
    old = timezone.now() - timedelta(days=40)
    responses = {name: submit(api, key=name).json()["id"] for name in ("gone", "kept", "live")}
    recent = submit(api, key="recent").json()["id"]
    IdempotencyKey.objects.exclude(key="recent").update(created_at=old)
    # "gone": finished long ago -> job, events and key purged together.
    Job.objects.filter(pk=responses["gone"]).update(state="completed", finished_at=old)
    # "kept": the job finished recently (kept), its key is old -> only the key goes.
    Job.objects.filter(pk=responses["kept"]).update(state="completed", finished_at=timezone.now())
    # "live": still queued -> job and key stay, whatever their age.
    # "recent": key and job young -> both stay.
    Job.objects.filter(pk=recent).update(state="completed", finished_at=timezone.now())
    purge = drain(jobs.enqueue("durable.purge", {"older_than": "30d"}).pk)
    assert purge.state == "completed"
    assert set(IdempotencyKey.objects.values_list("key", flat=True)) == {"live", "recent"}
    assert not Job.objects.filter(pk=responses["gone"]).exists()
    assert Job.objects.filter(pk=responses["kept"]).exists()
    results = [r.result for r in purge.unit_results.all() if r.result]
    assert sum(r.get("idempotency_keys", 0) for r in results) == 2  # gone (with its job), kept
    # After the purge the key is free again: a repeat makes a new job.
    assert submit(api, key="kept").json()["id"] not in responses.values()
    assert submit(api, key="live").json()["id"] == responses["live"]


def test_retention__purges_keys_in_bounded_batches(api, monkeypatch):
    from durable.builtin import retention

    monkeypatch.setattr(retention, "PURGE_BATCH", 2)
    for index in range(5):
        submit(api, key=f"k{index}")
    Job.objects.update(state="completed", finished_at=timezone.now())
    IdempotencyKey.objects.update(created_at=timezone.now() - timedelta(days=2))
    purge = drain(jobs.enqueue("durable.purge", {"older_than": "1d"}).pk)
    keys = sorted(r.key for r in purge.unit_results.all() if r.key.startswith("idempotency"))
    assert len(keys) == 3  # 2 + 2 + 1
    assert not IdempotencyKey.objects.exists()
    assert Job.objects.filter(operation="durable.noop").count() == 5


def test_purge_jobs_command__reports_keys(api, capsys):
    submit(api, key="cmd")
    IdempotencyKey.objects.update(created_at=timezone.now() - timedelta(days=2))
    Job.objects.update(state="completed", finished_at=timezone.now())
    call_command("purge_jobs", "--older-than", "1d")
    assert "and 1 idempotency key(s)" in capsys.readouterr().out


# --- management commands ----------------------------------------------------------------------


def test_create_api_client__prints_the_token_once_and_stores_its_hash(capsys, api):
    call_command("create_api_client", "deploy", "--scope", "jobs:read")
    out, err = capsys.readouterr()
    token = out.strip()
    assert token.startswith("dur_")
    assert token not in err
    client = Client.objects.get(name="deploy")
    assert client.scopes == ["jobs:read"]
    assert token not in json.dumps(list(Client.objects.values()), default=str)
    assert api.get("/api/jobs", token=token).status_code == 200
    with pytest.raises(CommandError, match="exists"):
        call_command("create_api_client", "deploy", "--scope", "jobs:read")
    with pytest.raises(CommandError, match="--scope"):
        call_command("create_api_client", "no-scope")
    with pytest.raises(CommandError):
        call_command("create_api_client", "bad-scope", "--scope", "admin")


def test_create_api_client__accepts_every_scope(capsys, api):
    scopes = ["jobs:read", "jobs:write", "jobs:admin", "schedules:read", "schedules:write"]
    call_command("create_api_client", "ops", *[arg for s in scopes for arg in ("--scope", s)])
    token = capsys.readouterr().out.strip()
    assert sorted(Client.objects.get(name="ops").scopes) == sorted(scopes)
    body = {"operation": "test.one_per_target", "input": {"target": "t"}}
    assert submit(api, body, token=token).status_code == 202  # privileged: jobs:admin works


def test_create_api_client__rotate_replaces_the_token_and_lifts_a_revocation(capsys, api):
    call_command("create_api_client", "deploy", "--scope", "jobs:read")
    old = capsys.readouterr().out.strip()
    call_command("revoke_api_client", "deploy")
    call_command("create_api_client", "deploy", "--rotate", "--scope", "jobs:write")
    new = capsys.readouterr().out.strip().splitlines()[-1]
    assert new != old
    assert api.get("/api/jobs", token=old).status_code == 401
    assert submit(api, token=new).status_code == 202
    assert api.get("/api/jobs", token=new).status_code == 403  # scopes were replaced
    call_command("list_api_clients")
    listing = capsys.readouterr().out
    assert "deploy\tactive\tjobs:write" in listing
    assert new not in listing
    with pytest.raises(CommandError):
        call_command("revoke_api_client", "nobody")


def test_submit__an_operation_with_an_unknown_access_marking_is_never_started(
    api, make_client, monkeypatch
):
    # What the dashboard does (rights.start_refusal): closed, not "privileged".
    force_access(monkeypatch, "test.rows", "mystery")
    _, admin = make_client("ops", ("jobs:write", "jobs:admin"))
    refused = submit(api, {"operation": "test.rows"}, token=admin)
    assert refused.status_code == 403
    assert refused.json()["code"] == "operation_not_allowed"
    assert not Job.objects.exists()
