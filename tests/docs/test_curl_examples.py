"""The curl examples of the HTTP API how-to, run with curl against a real gunicorn and worker.

Each command runs as written, with three substitutions: the server's address for
``http://127.0.0.1:8000``, the ids the server really handed out for the pages'
``42`` and ``7``, and ``-w`` appended to read the status code.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from durable.jobs import enqueue
from tests.integration.dashboard.server import Gunicorn
from tests.testapp import tasks

from .snippets import find

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
PAGE = "docs/how-to/http-api.md"
EXAMPLE_URL = "http://127.0.0.1:8000"


def commands(code: str) -> list[str]:
    """A block's shell commands: continuations and multi-line quotes joined, no comments."""
    found, pending = [], ""
    for line in code.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        line = re.sub(r"\s+#\s[^'\"]*$", "", line)  # a trailing comment ("# 204")
        pending += line + "\n"
        if line.rstrip().endswith("\\"):
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # an open quote
            continue
        found.append(pending.strip())
        pending = ""
    return found


def run(command: str, server: Gunicorn, token: str, ids: dict[str, str]) -> tuple[int, str]:
    command = command.replace(EXAMPLE_URL, server.url)
    for example, real in ids.items():
        command = re.sub(rf"(/api/\w+/){example}\b", rf"\g<1>{real}", command)
    done = subprocess.run(
        [shutil.which("bash") or "/bin/bash", "-c", command + " -w '\\nHTTP %{http_code}'"],
        env={**os.environ, "TOKEN": token},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"{command}\n{done.stderr}"
    body, _, status = done.stdout.rpartition("\nHTTP ")
    return int(status), body


@pytest.fixture
def server(tmp_path: Path) -> Any:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    # A stream lasts up to 55 s here (25 by default), so the job's 5 one-second units
    # finish within one stream even on a loaded machine; curl's own limit is 60 s.
    site = Gunicorn(
        tmp_path, DURABLE_API_STREAM_POLL_SECONDS="0.2", DURABLE_API_STREAM_SECONDS="55"
    ).start(workers=1)
    try:
        yield site
    finally:
        site.close()


def token(*scopes: str) -> str:
    out = io.StringIO()
    args = [arg for scope in scopes for arg in ("--scope", scope)]
    call_command("create_api_client", "ci", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue().strip()


def test_submit_a_job_and_follow_it(server: Gunicorn, workers: Any) -> None:
    workers.start(lease=5)
    secret = token("jobs:read", "jobs:write")
    submit, *rest = commands(find(PAGE, "Idempotency-Key: deploy-", language="sh").code)
    status, body = run(submit, server, secret, {})
    assert status == 202, body
    assert "Idempotent-Replayed: false" in body
    job_id = re.search(r"Location: /api/jobs/(\d+)", body)[1]
    statuses = []
    for command in rest:
        status, body = run(command, server, secret, {"42": job_id})
        statuses.append(status)
        if "text/event-stream" in command:
            # The stream follows the job to its end (5 units of 1 s) and closes.
            assert "event: end" in body
            assert '"state":"completed"' in body.replace(" ", "")
    # job, events page, stream, cancel (the job is completed by then: 409), the list
    assert statuses == [200, 200, 200, 409, 200]


def test_scheduled_rules_over_http(server: Gunicorn) -> None:
    secret = token("schedules:read", "schedules:write")
    create, *rest = commands(find(PAGE, '"name": "nightly-scan"', language="sh").code)
    status, body = run(create, server, secret, {})
    assert status == 201, body
    schedule_id = re.search(r"Location: /api/schedules/(\d+)", body)[1]
    statuses = [run(command, server, secret, {"7": schedule_id})[0] for command in rest]
    assert statuses == [200, 200, 204]  # read, disable, delete


def test_a_task_result(server: Gunicorn, workers: Any) -> None:
    secret = token("jobs:read")
    (command,) = commands(find(PAGE, "/api/jobs/42/result", language="sh").code)
    result = tasks.add.enqueue(2, 3)
    workers.run(lease=5)
    status, body = run(command, server, secret, {"42": result.id})
    assert status == 200, body
    answer = json.loads(body)
    assert (answer["task"], answer["status"], answer["return_value"]) == (
        "tests.testapp.tasks.add",
        "SUCCESSFUL",
        5,
    )
    plain = enqueue("durable.noop", {"units": 1})
    status, body = run(command, server, secret, {"42": str(plain.pk)})
    assert status == 404, body
    assert "not_a_task" in body
