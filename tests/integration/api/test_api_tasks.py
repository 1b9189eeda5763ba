"""The job API reads a Django task's result; every answer is checked against the document."""

from __future__ import annotations

import pytest

from durable import jobs
from tests.integration.test_tasks import run_tasks
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def test_result__a_successful_task_answers_its_return_value(api):
    result = tasks.echo.using(priority=4).enqueue(1, (2, 3), key="v")
    run_tasks()
    body = api.get(f"/api/jobs/{result.id}/result").json()
    assert body["id"] == result.id
    assert body["task"] == "tests.testapp.tasks.echo"
    assert (body["status"], body["finished"]) == ("SUCCESSFUL", True)
    assert (body["queue"], body["priority"], body["backend"]) == ("emails", 4, "default")
    assert (body["args"], body["kwargs"]) == ([1, [2, 3]], {"key": "v"})
    assert body["has_return_value"] is True
    assert body["return_value"]["nested"] == [{"t": [1, 2]}, None, 1.5, True]
    assert (body["attempts"], body["worker_ids"], body["errors"]) == (1, ["test-worker"], [])


def test_result__a_failed_task_answers_its_errors_without_tracebacks(api):
    result = tasks.fail.enqueue("boom")
    run_tasks()
    body = api.get(f"/api/jobs/{result.id}/result").json()
    assert body["status"] == "FAILED"
    assert body["has_return_value"] is False
    assert body["return_value"] is None
    assert body["errors"] == [
        {"exception_class_path": "builtins.ValueError", "message": "boom"},
        {"exception_class_path": "builtins.ValueError", "message": "boom"},
    ]


def test_result__a_queued_task_is_ready(api):
    result = tasks.add.enqueue(1, 2)
    body = api.get(f"/api/jobs/{result.id}/result").json()
    assert (body["status"], body["finished"], body["attempts"]) == ("READY", False, 0)
    assert body["started_at"] is None


def test_result__a_job_that_is_no_task_or_no_job_is_404(api):
    other = jobs.enqueue("durable.noop", {})
    response = api.get(f"/api/jobs/{other.pk}/result")
    assert response.status_code == 404
    assert response.json()["code"] == "not_a_task"
    assert api.get("/api/jobs/999999/result").status_code == 404


def test_result__needs_the_read_scope(api, make_client):
    result = tasks.add.enqueue(1, 2)
    _client, token = make_client("writer", scopes=("jobs:write",))
    assert api.get(f"/api/jobs/{result.id}/result", token=token).status_code == 403
