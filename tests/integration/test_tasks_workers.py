"""Django tasks run by real ``runworker`` subprocesses, killed and stopped for real.

``transaction=True`` throughout: the workers (and the reader process) are other
processes with their own connections, so the test's rows must really be committed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from durable import jobs
from durable.models import Job
from durable.tasks.compat import TaskResultStatus
from tests.conftest import BASE_DIR, database_url, wait_until
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def lines(path: Path) -> Counter:
    return Counter(path.read_text().splitlines()) if path.exists() else Counter()


def held_task(tmp_path: Path, hold_at: int = 1):
    """A three-step task whose step ``hold_at`` waits while ``<out>.hold`` exists."""
    out = tmp_path / "steps.txt"
    hold = Path(str(out) + ".hold")
    hold.touch()
    result = tasks.stepped.enqueue(str(out), steps=3, hold_at=hold_at)
    return result, out, hold


def test_sigkill_mid_task__retried_and_the_finished_steps_are_not_repeated(workers, tmp_path):
    result, out, hold = held_task(tmp_path)
    first = workers.start()
    wait_until(lambda: lines(out)["begin 1"] == 1)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    hold.unlink()
    job = Job.objects.get(pk=int(result.id))
    assert job.state == "running"  # what the dead worker left
    assert job.checkpoint["steps_done"] == 1

    second = workers.run()
    assert second.returncode == 0, workers.log(second)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL, workers.log(second)
    assert result.return_value == 30
    # Step 0 was committed before the crash: never again. Step 1 was in flight: once more.
    assert lines(out) == {
        "begin 0": 1,
        "done 0": 1,
        "begin 1": 2,
        "done 1": 1,
        "begin 2": 1,
        "done 2": 1,
    }
    assert len(result.worker_ids) == 2
    assert len(set(result.worker_ids)) == 2
    assert [e.exception_class_path for e in result.errors] == ["durable.tasks.WorkerLost"]


def test_sigterm_mid_task__released_at_the_next_step_with_no_attempt_spent(workers, tmp_path):
    result, out, hold = held_task(tmp_path)
    proc = workers.start()
    wait_until(lambda: lines(out)["begin 1"] == 1)
    proc.send_signal(signal.SIGTERM)
    # The main thread passes the stop to running tasks within 0.1 s; only then may
    # step 1 finish (within the grace period), so that step 2 meets the stop.
    time.sleep(1.0)
    hold.unlink()
    assert proc.wait(timeout=30) == 0, workers.log(proc)
    job = Job.objects.get(pk=int(result.id))
    assert (job.state, job.attempts, job.lease_owner) == ("queued", 0, None), workers.log(proc)
    assert job.events.filter(kind="released").count() == 1
    assert lines(out)["begin 2"] == 0
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.errors == []

    again = workers.run()
    assert again.returncode == 0, workers.log(again)
    result.refresh()
    assert result.return_value == 30
    assert lines(out) == {f"{kind} {i}": 1 for kind in ("begin", "done") for i in range(3)}


@pytest.fixture
def admin_client() -> Client:
    user = get_user_model().objects.create_superuser("boss", "boss@example.com", "pw-pw-pw-pw")
    client = Client()
    client.force_login(user)
    return client


def act(client: Client, job_id: int, action: str) -> None:
    response = client.post(reverse("problems:job-action", args=[job_id, action]))
    assert response.status_code in (200, 302), response.content[:300]


def test_dashboard_pause__stops_at_the_step_boundary_and_resume_finishes(
    workers, tmp_path, admin_client
):
    result, out, hold = held_task(tmp_path)
    job_id = int(result.id)
    proc = workers.start()
    wait_until(lambda: lines(out)["begin 1"] == 1)
    act(admin_client, job_id, "pause")
    hold.unlink()
    wait_until(lambda: Job.objects.filter(pk=job_id, state="paused", lease_owner=None).exists())
    assert lines(out)["begin 2"] == 0  # stopped after step 1, before step 2
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert Job.objects.get(pk=job_id).attempts == 0

    act(admin_client, job_id, "resume")
    wait_until(lambda: Job.objects.filter(pk=job_id, state="completed").exists())
    result.refresh()
    assert result.return_value == 30
    assert lines(out) == {f"{kind} {i}": 1 for kind in ("begin", "done") for i in range(3)}
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, workers.log(proc)


def test_dashboard_cancel__ends_the_task_failed_with_task_cancelled(
    workers, tmp_path, admin_client
):
    result, out, hold = held_task(tmp_path)
    job_id = int(result.id)
    proc = workers.start()
    wait_until(lambda: lines(out)["begin 1"] == 1)
    act(admin_client, job_id, "cancel")
    hold.unlink()
    wait_until(lambda: Job.objects.filter(pk=job_id, state="cancelled").exists())
    assert lines(out)["begin 2"] == 0
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == ["durable.tasks.TaskCancelled"]
    assert "boss" in result.errors[0].traceback
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, workers.log(proc)


def test_worker__imports_a_task_module_only_once_it_claims_a_job_of_it(workers, tmp_path):
    marker = tmp_path / "imported.txt"
    env = {"TEST_TASK_IMPORT_MARKER": str(marker)}
    # Enqueued by path, as another process would: this test process never imports it.
    lazy = jobs.enqueue(
        "django.task",
        {"task": "tests.testapp.lazy_tasks.lazy", "args": [21]},
        queue="low",
    )
    plain = tasks.add.enqueue(1, 2)
    first = workers.run(env=env)  # the default queue only
    assert first.returncode == 0, workers.log(first)
    plain.refresh()
    assert plain.return_value == 3
    assert not marker.exists(), "the worker imported a task module it had no job of"

    second = workers.run("--queue", "low", env=env)
    assert second.returncode == 0, workers.log(second)
    lazy.refresh_from_db()
    assert lazy.state == "completed", workers.log(second)
    assert marker.read_text().count("imported by") == 1


def test_results__are_read_from_another_process(workers):
    result = tasks.echo.enqueue(1, (2, 3), key="value")
    failed = tasks.refuse.enqueue()
    run = workers.run("--queue", "emails", "--queue", "default")
    assert run.returncode == 0, workers.log(run)
    script = (
        "import json\n"
        "from tests.testapp import tasks\n"
        f"ok = tasks.echo.get_result({result.id!r})\n"
        f"bad = tasks.refuse.get_result({failed.id!r})\n"
        "print(json.dumps({'status': ok.status, 'value': ok.return_value,"
        " 'workers': ok.worker_ids, 'bad': bad.status,"
        " 'errors': [e.exception_class_path for e in bad.errors]}))\n"
    )
    env = {**workers.env(), "DATABASE_URL": database_url()}
    reader = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert reader.returncode == 0, reader.stderr
    seen = json.loads(reader.stdout.strip().splitlines()[-1])
    assert seen["status"] == "SUCCESSFUL"
    assert seen["value"]["args"] == [1, [2, 3]]
    assert seen["value"]["kwargs"] == {"key": "value"}
    assert len(seen["workers"]) == 1
    assert seen["bad"] == "FAILED"
    assert seen["errors"] == ["builtins.PermissionError"]
