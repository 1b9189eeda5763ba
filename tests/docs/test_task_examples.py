"""The examples of docs/how-to/write-a-django-task.md, run as written on DurableBackend.

Each task example is executed into a real module registered in ``sys.modules``, as
a task module of an app would be, so the worker finds the task by its dotted path.
On Django 5.2 ``django.tasks`` is the ``django_tasks`` package (the page says so in
its comment); the test puts it under the Django 6 name the example imports.
"""

from __future__ import annotations

import sys
import time
import types
from types import SimpleNamespace
from typing import Any

import pytest

from durable.lease import claim
from durable.models import Job
from durable.operations import registered
from durable.tasks import DurableBackend
from durable.tasks.compat import FRAMEWORK, TaskResultStatus
from durable.worker import Worker

from .snippets import Block, find

PAGE = "docs/how-to/write-a-django-task.md"


def run_tasks(queues: list[str], timeout: float = 10.0) -> int:
    """Claim and run every due job on ``queues`` in this thread; returns how many ran."""
    worker = Worker(worker_id="docs-worker", burst=True, lease_seconds=30)
    ran, deadline = 0, time.monotonic() + timeout
    while time.monotonic() < deadline:
        claimed = claim(
            "docs-worker", queues=queues, operations=sorted(registered()), lease_seconds=30
        )
        if claimed is None:
            return ran
        worker.execute(*claimed)
        ran += 1
    raise AssertionError("tasks kept coming")


@pytest.fixture
def task_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """An importable module for the page's task code (``docs_tasks_example``)."""
    if FRAMEWORK == "django_tasks":  # Django 5.2: the same API under the backport's name
        import django_tasks

        monkeypatch.setitem(sys.modules, "django.tasks", django_tasks)
    module = types.ModuleType("docs_tasks_example")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def run_into(block: Block, module: types.ModuleType, code: str | None = None) -> None:
    exec(compile(code or block.code, f"{block.page}:{block.line}", "exec"), module.__dict__)  # noqa: S102


def test_the_settings_example_configures_a_valid_backend() -> None:
    namespace = find(PAGE, '"BACKEND": "durable.tasks.DurableBackend"').run()
    params = namespace["TASKS"]["default"]
    backend = DurableBackend("docs", params)
    assert backend.options_error == ""
    assert list(backend.check()) == []
    assert set(backend.queues) == {"default", "emails"}
    assert (backend.task_options.max_attempts, backend.task_options.backoff_max) == (3, 300)


@pytest.mark.django_db
def test_the_task_and_its_result_example(task_module: types.ModuleType) -> None:
    run_into(find(PAGE, "def send_invoice"), task_module)
    usage = find(PAGE, "result = send_invoice.enqueue(42)")
    enqueue_part, later_part = usage.code.split("# ... later, once a worker has run it:\n")
    namespace: dict[str, Any] = {"send_invoice": task_module.send_invoice}
    exec(compile(enqueue_part, usage.page, "exec"), namespace)  # noqa: S102
    result = namespace["result"]
    job = Job.objects.get(pk=int(result.id))
    assert (job.queue, job.priority) == ("emails", 10)
    assert result.status == TaskResultStatus.READY

    assert run_tasks(["emails"]) == 1
    exec(compile(later_part, usage.page, "exec"), namespace)  # noqa: S102
    result = namespace["result"]
    assert (result.status, result.return_value, result.errors) == (
        TaskResultStatus.SUCCESSFUL,
        None,
        [],
    )
    assert result.args == [42]


@pytest.mark.django_db
def test_enqueue_on_commit_example(
    task_module: types.ModuleType, django_capture_on_commit_callbacks: Any
) -> None:
    run_into(find(PAGE, "def send_invoice"), task_module)

    class Invoice:  # the page's model: only its primary key matters here
        class objects:
            @staticmethod
            def create(*args: Any, **kwargs: Any) -> SimpleNamespace:
                return SimpleNamespace(pk=7)

    block = find(PAGE, "transaction.on_commit(partial(send_invoice.enqueue")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        block.run({"Invoice": Invoice, "send_invoice": task_module.send_invoice})
    assert not Job.objects.exists()  # nothing before the commit
    assert len(callbacks) == 1
    callbacks[0]()
    job = Job.objects.get()
    assert job.input["args"] == [7]


@pytest.mark.django_db
def test_durable_steps_example__a_retry_repeats_only_the_step_that_failed(
    task_module: types.ModuleType,
) -> None:
    calls: list[str] = []
    notify_failures = [RuntimeError("mail server down")]

    def fetch_rows(account_id: int) -> list[tuple[int, str]]:
        calls.append("fetch")
        return [(1, "a"), (2, "b")]

    def save_rows(rows: list) -> int:
        calls.append("save")
        assert rows == [[1, "a"], [2, "b"]]  # as stored: tuples became lists
        return len(rows)

    def notify_owner(account_id: int, saved: int) -> None:
        calls.append("notify")
        if notify_failures:
            raise notify_failures.pop()

    task_module.__dict__.update(fetch_rows=fetch_rows, save_rows=save_rows)
    task_module.notify_owner = notify_owner
    run_into(find(PAGE, "def send_invoice"), task_module)  # the page's imports
    run_into(find(PAGE, "def import_account"), task_module)

    result = task_module.import_account.enqueue(5)
    assert run_tasks(["default"]) == 2  # the failed attempt, then the retry
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 2
    assert len(result.errors) == 1
    assert "mail server down" in result.errors[0].traceback
    # fetch and save ran once across both attempts; only notify was repeated.
    assert calls == ["fetch", "save", "notify", "notify"]
    job = Job.objects.get(pk=int(result.id))
    assert job.checkpoint == {"steps_done": 3, "steps_total": 3}
