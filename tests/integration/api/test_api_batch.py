"""``POST /api/jobs/batch``: many jobs of one operation in one request (enqueue_many).

Every response is checked against the OpenAPI document (see conftest).
"""

from __future__ import annotations

import json

import pytest

from durable.api.models import Client, IdempotencyKey
from durable.api.parse import MAX_BATCH_JOBS
from durable.models import Job, JobEvent

pytestmark = pytest.mark.django_db


def post_batch(api, body, *, key=None, **kwargs):
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    return api.post("/api/jobs/batch", content=json.dumps(body).encode(), headers=headers, **kwargs)


def test_batch__creates_every_job_in_order_with_shared_options(api):
    inputs = [{"units": n} for n in range(1, 6)]
    response = post_batch(
        api, {"operation": "durable.noop", "inputs": inputs, "priority": 4, "queue": "bulk"}
    )
    assert response.status_code == 202
    body = response.json()
    assert (body["count"], body["created"]) == (5, 5)
    assert [job["input"]["units"] for job in body["jobs"]] == [1, 2, 3, 4, 5]
    assert all(job["created"] for job in body["jobs"])
    for job in body["jobs"]:
        stored = Job.objects.get(pk=job["id"])
        assert (stored.input, stored.priority, stored.queue, stored.owner) == (
            job["input"], 4, "bulk", "api:ci",
        )  # fmt: skip
        assert job["url"] == f"/api/jobs/{stored.pk}"
    assert JobEvent.objects.filter(kind="enqueued").count() == 5


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"operation": "durable.noop"}, ["inputs"]),
        ({"operation": "durable.noop", "inputs": []}, ["inputs"]),
        ({"operation": "durable.noop", "inputs": [{"units": 1}, 3]}, ["inputs[1]"]),
        ({"operation": "durable.noop", "inputs": [{}], "input": {}}, ["input"]),
        (
            {"operation": "durable.noop", "inputs": [{"units": 1}, {"units": "x"}]},
            ["inputs[1].units"],
        ),
        ({"operation": "durable.noop", "inputs": [{}] * (MAX_BATCH_JOBS + 1)}, ["inputs"]),
        ({"operation": "durable.noop", "inputs": [{}], "priority": 500}, ["priority"]),
    ],
)
def test_batch__any_bad_input_is_400_and_creates_nothing(api, body, fields):
    response = post_batch(api, body)
    assert response.status_code == 400, response.text
    assert [error["field"] for error in response.json()["errors"]] == fields
    assert not Job.objects.exists()


def test_batch__unique_keys_return_the_unfinished_job(api):
    body = {"operation": "test.one_per_target", "inputs": [{"target": "a"}, {"target": "a"}]}
    Client.objects.update(scopes=["jobs:read", "jobs:write", "jobs:admin"])  # it is privileged
    response = post_batch(api, body)
    assert response.status_code == 202, response.text
    jobs = response.json()["jobs"]
    assert [job["created"] for job in jobs] == [True, False]
    assert jobs[0]["id"] == jobs[1]["id"]
    assert response.json()["created"] == 1


def test_batch__idempotency_key_replays_the_first_response(api):
    body = {"operation": "durable.noop", "inputs": [{"units": 1}, {"units": 2}]}
    first = post_batch(api, body, key="batch-1")
    again = post_batch(api, body, key="batch-1")
    assert first.status_code == again.status_code == 202
    assert (first.headers["Idempotent-Replayed"], again.headers["Idempotent-Replayed"]) == (
        "false", "true",
    )  # fmt: skip
    assert again.content == first.content
    assert Job.objects.count() == 2
    assert IdempotencyKey.objects.get(key="batch-1").job_id == first.json()["jobs"][0]["id"]
    other = post_batch(api, {**body, "priority": 3}, key="batch-1")
    assert other.status_code == 422
    assert Job.objects.count() == 2


def test_batch__needs_the_write_scope_and_a_startable_operation(api, make_client):
    _, reader = make_client("reader", ("jobs:read",))
    body = {"operation": "durable.noop", "inputs": [{}]}
    assert post_batch(api.with_token(reader), body).status_code == 403
    privileged = {"operation": "test.one_per_target", "inputs": [{"target": "a"}]}
    assert post_batch(api, privileged).status_code == 403  # needs jobs:admin
    assert not Job.objects.exists()
