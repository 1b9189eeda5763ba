"""``durable`` works in a site without ``recovery`` (and without ``django_htmx``).

A site of its own (tests/enginesite: Django's contenttypes and auth, ``durable``,
the API's URLs and a ``TASKS`` backend; nothing of this repository's settings) runs
in subprocesses against a database of its own, on this leg's vendor: ``check``,
``migrate``, a Django task and an operation submitted through the HTTP API, both run
by ``runworker --burst``, and their results read back through the API.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .sites import on_postgres, own_database, postgres, run, runserver

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


@pytest.fixture
def engine_site(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "PYTHONPATH"} and not key.startswith("TEST_")
    }
    env |= {
        "DJANGO_SETTINGS_MODULE": "tests.enginesite.settings",
        "ENGINE_SITE_DIR": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
    }
    name = own_database("engine") if on_postgres() else None
    if name:
        postgres(f'DROP DATABASE IF EXISTS "{name}"')
        postgres(f'CREATE DATABASE "{name}"')
        env["ENGINE_SITE_POSTGRES"] = name
    else:
        env["ENGINE_SITE_SQLITE"] = str(tmp_path / "engine.sqlite3")
    try:
        yield env
    finally:
        if name:
            postgres(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_engine_alone__jobs_workers_api_and_tasks(engine_site, tmp_path):
    env = engine_site
    manage = [sys.executable, "manage.py"]
    run([*manage, "check", "--fail-level", "WARNING"], ROOT, env)
    # Loading the apps and every URL imports nothing of the dashboard's.
    probe = (
        "import sys, django; django.setup(); from django.urls import get_resolver; "
        "get_resolver().url_patterns; import durable.worker, durable.tasks.backend; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'recovery', 'django_htmx'}))"
    )
    assert run([sys.executable, "-c", probe], ROOT, env).strip() == "[]"
    run([*manage, "migrate", "--noinput", "-v", "0"], ROOT, env)

    # A Django task, enqueued through the framework with DurableBackend.
    enqueue = "from tests.enginesite.tasks import add; print(add.enqueue(2, 3).id)"
    task_id = int(run([*manage, "shell", "--no-imports", "-c", enqueue], ROOT, env).strip())
    token = run(
        [*manage, "create_api_client", "engine", "--scope", "jobs:read", "--scope", "jobs:write"],
        ROOT,
        env,
    ).strip()

    log = tmp_path / "runserver.log"
    auth = {"headers": {"Authorization": f"Bearer {token}"}}
    with runserver(manage, ROOT, env, log, "/api/openapi.json", **auth) as (api, spec):
        assert spec.status_code == 200
        submitted = api.post(
            "/api/jobs",
            content=json.dumps({"operation": "durable.noop", "input": {"units": 2}}),
            headers={"Content-Type": "application/json"},
        )
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["id"]

        worker = run([*manage, "runworker", "--burst"], ROOT, env, timeout=120, stderr=True)
        assert not re.search(r"ERROR|Traceback|level=error", worker), worker

        job = api.get(f"/api/jobs/{job_id}").json()
        assert job["state"] == "completed", job
        result = api.get(f"/api/jobs/{task_id}/result").json()
        assert (result["status"], result["return_value"]) == ("SUCCESSFUL", 5), result
