"""Django's Tasks framework on DurableBackend: its documented behaviour, test by test.

Jobs run in the test's own thread and connection (``run_tasks``), so these are
ordinary transactional tests; tests/integration/test_tasks_workers.py uses real
worker subprocesses.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.core import checks
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from durable import jobs
from durable.errors import InputRejected
from durable.lease import claim
from durable.models import Job, UnitResult
from durable.operations import registered
from durable.tasks import DurableBackend
from durable.tasks.compat import (
    InvalidTaskError,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from durable.tasks.policy import TASK_OPERATION
from durable.worker import Worker
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

ALL_QUEUES = ["default", "emails", "low"]


def run_tasks(*, queues: list[str] = ALL_QUEUES, timeout: float = 10.0) -> int:
    """Claim and run every due job on ``queues`` in this thread; returns how many ran."""
    worker = Worker(worker_id="test-worker", burst=True, lease_seconds=30)
    ran, deadline = 0, time.monotonic() + timeout
    while time.monotonic() < deadline:
        claimed = claim(
            "test-worker", queues=queues, operations=sorted(registered()), lease_seconds=30
        )
        if claimed is None:
            return ran
        worker.execute(*claimed)
        ran += 1
    raise AssertionError("tasks kept coming")


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


class Seen(list):
    """(signal, result id, status) per framework signal; ``results`` keeps the TaskResults."""

    def __init__(self) -> None:
        super().__init__()
        self.results: list = []


@pytest.fixture
def signals_seen():
    seen = Seen()

    def receiver(name):
        def record(sender, task_result, **kwargs):
            seen.append((name, task_result.id, task_result.status))
            seen.results.append(task_result)

        return record

    receivers = [
        (task_enqueued, receiver("enqueued")),
        (task_started, receiver("started")),
        (task_finished, receiver("finished")),
    ]
    for signal, fn in receivers:
        signal.connect(fn)
    yield seen
    for signal, fn in receivers:
        signal.disconnect(fn)


# --- the backend ---------------------------------------------------------------------


def test_backend__is_the_configured_durable_backend_with_every_capability():
    backend = task_backends["default"]
    assert isinstance(backend, DurableBackend)
    assert backend.supports_defer
    assert backend.supports_priority
    assert backend.supports_get_result
    assert backend.supports_async_task


def test_enqueue__returns_a_ready_result_backed_by_one_job():
    result = tasks.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    assert result.enqueued_at is not None
    assert (result.started_at, result.finished_at, result.last_attempted_at) == (None,) * 3
    assert (result.args, result.kwargs, result.backend) == ([2, 3], {}, "default")
    assert (result.worker_ids, result.errors, result.attempts) == ([], [], 0)
    assert not result.is_finished
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value
    job = Job.objects.get(pk=int(result.id))
    assert job.operation == TASK_OPERATION
    assert job.input == {
        "task": "tests.testapp.tasks.add",
        "backend": "default",
        "args": [2, 3],
        "kwargs": {},
    }
    assert (job.queue, job.priority, job.max_attempts) == ("default", 0, 3)


def test_get_result__reads_the_finished_task_and_refresh_updates_in_place():
    result = tasks.add.enqueue(2, 3)
    assert run_tasks() == 1
    fresh = tasks.add.get_result(result.id)
    assert fresh.status == TaskResultStatus.SUCCESSFUL
    assert fresh.return_value == 5
    assert result.status == TaskResultStatus.READY  # a result is a snapshot...
    result.refresh()  # ...until refreshed
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.worker_ids == ["test-worker"]
    assert result.attempts == 1
    assert result.enqueued_at <= result.started_at <= result.last_attempted_at
    assert result.last_attempted_at <= result.finished_at
    assert task_backends["default"].get_result(result.id).return_value == 5


def test_get_result__unknown_ids_and_other_tasks_are_refused():
    result = tasks.add.enqueue(1, 1)
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result("999999")
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result("not-a-number")
    other = jobs.enqueue("durable.noop", {})
    with pytest.raises(TaskResultDoesNotExist):  # a job, but not a task
        tasks.add.get_result(str(other.pk))
    from durable.tasks.compat import FRAMEWORK

    mismatch = __import__(f"{FRAMEWORK}.exceptions", fromlist=["x"]).TaskResultMismatch
    with pytest.raises(mismatch):
        tasks.record.get_result(result.id)


def test_aenqueue_and_aget_result__work_from_async_code():
    from asgiref.sync import async_to_sync, sync_to_async

    async def scenario():
        result = await tasks.add.aenqueue(4, 5)
        await sync_to_async(run_tasks)()
        fresh = await tasks.add.aget_result(result.id)
        await result.arefresh()
        return fresh, result

    fresh, result = async_to_sync(scenario)()
    assert fresh.return_value == 9
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_status__ready_running_successful_with_signals(
    signals_seen, django_capture_on_commit_callbacks
):
    result = tasks.add.enqueue(1, 2)
    with django_capture_on_commit_callbacks(execute=True):  # finished: sent after the commit
        run_tasks()
    assert signals_seen == [
        ("enqueued", result.id, TaskResultStatus.READY),
        ("started", result.id, TaskResultStatus.RUNNING),
        ("finished", result.id, TaskResultStatus.SUCCESSFUL),
    ]
    running, finished = signals_seen.results[1:]
    assert running.worker_ids == ["test-worker"]
    assert running.started_at is not None
    assert running.finished_at is None
    assert finished.return_value == 3
    assert finished.finished_at is not None
    assert finished.worker_ids == ["test-worker"]
    assert finished.finished_at >= finished.started_at >= finished.enqueued_at


def test_status__failed_attempts_each_leave_an_error_then_failed(
    signals_seen, django_capture_on_commit_callbacks
):
    result = tasks.fail.enqueue("boom")
    with django_capture_on_commit_callbacks(execute=True):
        run_tasks()  # attempt 1 fails; max_attempts=2 and no backoff: attempt 2 runs at once
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.is_finished
    assert len(result.errors) == 2  # one per failed attempt
    for error in result.errors:
        assert error.exception_class_path == "builtins.ValueError"
        assert error.exception_class is ValueError
        assert "ValueError: boom" in error.traceback
        assert "tests/testapp/tasks.py" in error.traceback
    assert result.finished_at is not None
    assert result.attempts == 2
    with pytest.raises(ValueError, match="failed"):
        _ = result.return_value
    kinds = [(name, status) for name, _id, status in signals_seen]
    assert kinds == [
        ("enqueued", "READY"),
        ("started", "RUNNING"),
        ("started", "RUNNING"),
        ("finished", "FAILED"),  # once, when the task is finished: not per attempt
    ]


def test_status__between_attempts_the_task_is_ready_again_with_its_error():
    result = tasks.fail.enqueue("later")
    Job.objects.filter(pk=int(result.id)).update(max_attempts=5)
    worker = Worker(worker_id="w1", burst=True)
    claimed = claim("w1", queues=["default"], operations=[TASK_OPERATION], lease_seconds=30)
    worker.execute(*claimed)  # one attempt only
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"]
    assert result.finished_at is None
    assert result.worker_ids == ["w1"]


# --- arguments and return values -------------------------------------------------------


def test_json__arguments_and_return_values_round_trip_as_json():
    result = tasks.echo.enqueue(1, (2, 3), b"bytes", k={"n": [None, 1.5]})
    assert result.args == [1, [2, 3], "bytes"]
    assert result.kwargs == {"k": {"n": [None, 1.5]}}
    run_tasks()
    result.refresh()
    assert result.return_value == {
        "args": [1, [2, 3], "bytes"],
        "kwargs": {"k": {"n": [None, 1.5]}},
        "nested": [{"t": [1, 2]}, None, 1.5, True],
    }


@pytest.mark.parametrize(
    "bad",
    [
        datetime(2026, 1, 1),  # not JSON
        {1, 2},  # a set
        object(),
    ],
)
def test_json__an_argument_json_cannot_hold_is_refused_and_nothing_is_enqueued(bad):
    with pytest.raises(TypeError):
        tasks.echo.enqueue(bad)
    assert not Job.objects.exists()


def test_json__a_credential_in_the_arguments_is_refused_like_any_job_input():
    with pytest.raises(InputRejected, match="password"):
        tasks.echo.enqueue(password="hunter2-hunter2")
    assert not Job.objects.exists()


def test_json__a_return_value_json_cannot_hold_fails_the_task_clearly():
    result = tasks.not_json.enqueue()
    run_tasks()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert len(result.errors) == 1  # not retried: it would fail the same way
    assert "JSON cannot hold" in result.errors[0].traceback
    # The real exception, as Django's own backends report it (not the engine's verdict).
    assert result.errors[-1].exception_class_path in ("builtins.TypeError", "builtins.ValueError")


# --- priority, run_after, queues -----------------------------------------------------------


def test_priority__higher_runs_first(tmp_path):
    out = tmp_path / "order.txt"
    for priority in (-5, 10, 0, 3):
        tasks.record.using(priority=priority).enqueue(str(out), str(priority))
    run_tasks()
    assert lines(out) == ["10", "3", "0", "-5"]


@pytest.mark.parametrize("priority", [101, -101, 1.5])
def test_priority__outside_the_framework_range_is_refused(priority):
    with pytest.raises(InvalidTaskError):
        tasks.add.using(priority=priority)


def test_run_after__an_aware_time_defers_the_task():
    later = timezone.now() + timedelta(hours=1)
    result = tasks.add.using(run_after=later).enqueue(1, 1)
    assert result.task.run_after == later
    assert run_tasks() == 0
    job = Job.objects.get(pk=int(result.id))
    assert job.next_attempt_at == later
    assert tasks.add.get_result(result.id).task.run_after == later
    Job.objects.filter(pk=job.pk).update(next_attempt_at=timezone.now())
    assert run_tasks() == 1


def test_run_after__a_naive_time_is_refused():
    with pytest.raises(InvalidTaskError, match="aware"):
        tasks.add.using(run_after=datetime(2030, 1, 1, 12, 0))


def test_queues__the_task_runs_on_its_queue_and_only_workers_of_that_queue_take_it():
    result = tasks.echo.enqueue("hi")
    assert Job.objects.get(pk=int(result.id)).queue == "emails"
    assert run_tasks(queues=["default"]) == 0
    assert run_tasks(queues=["emails"]) == 1
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_queues__an_unknown_queue_is_refused():
    with pytest.raises(InvalidTaskError, match="Queue 'nope' is not valid"):
        tasks.add.using(queue_name="nope")


@pytest.mark.parametrize("name", ["a b", "-leading", "q" * 65])
def test_queues__a_name_no_job_can_have_is_refused_even_where_any_queue_is_allowed(name):
    with pytest.raises(InvalidTaskError, match="letters, digits"):
        tasks.add.using(backend="patient", queue_name=name)  # "patient" lists no QUEUES
    assert not Job.objects.exists()


def test_checks__a_queue_name_no_job_can_have_is_a_system_check_error():
    bad = {"default": {"BACKEND": "durable.tasks.DurableBackend", "QUEUES": ["default", "a b"]}}
    with override_settings(TASKS=bad):
        messages = list(task_backends["default"].check())
    assert [m.id for m in messages] == ["durable.E203"]
    assert "'a b' must be 1 to 64 letters" in messages[0].msg


def test_queues__using_another_backend_alias_applies_its_options():
    result = tasks.add.using(backend="patient", queue_name="anything").enqueue(1, 2)
    job = Job.objects.get(pk=int(result.id))
    assert (job.max_attempts, job.on_restart, job.queue) == (1, "retry", "anything")
    assert result.backend == "patient"
    run_tasks(queues=["anything"])
    assert task_backends["patient"].get_result(result.id).return_value == 3


# --- context, async, steps ---------------------------------------------------------------------


def test_takes_context__gets_the_result_and_the_attempt_number():
    result = tasks.with_context.enqueue(fail_first=1)
    run_tasks()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"attempt": 2, "id": result.id, "workers": 2}
    assert len(result.errors) == 1
    assert "attempt 1 fails" in result.errors[0].traceback


def test_async__an_async_task_function_runs_and_returns():
    result = tasks.add_async.enqueue(20, 22)
    run_tasks()
    result.refresh()
    assert result.return_value == 42


def test_async_steps__are_checkpointed_like_sync_steps(tmp_path):
    out = tmp_path / "steps.txt"
    result = tasks.stepped_async.enqueue(str(out), 2)
    run_tasks()
    result.refresh()
    assert result.return_value == [0, 1]
    keys = set(UnitResult.objects.filter(job_id=int(result.id)).values_list("key", flat=True))
    assert keys == {"step:a:0", "step:a:1", "task:return"}


def test_steps__a_retried_task_skips_the_steps_it_finished(tmp_path):
    out = tmp_path / "steps.txt"
    Path(str(out) + ".fail").touch()
    result = tasks.fails_after_step.enqueue(str(out))
    run_tasks()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "after 10"
    assert len(result.errors) == 1
    assert result.attempts == 2
    assert lines(out) == ["begin 1", "done 1"]  # step one ran once, across two attempts


def test_steps__progress_counts_the_steps_with_their_total(tmp_path):
    out = tmp_path / "steps.txt"
    result = tasks.stepped.enqueue(str(out), steps=3)
    run_tasks()
    job = Job.objects.get(pk=int(result.id))
    assert job.state == "completed"
    assert (job.units_done, job.units_total) == (4, 4)  # three steps and the return
    assert job.checkpoint == {"steps_done": 3, "steps_total": 3}
    assert tasks.stepped.get_result(result.id).return_value == 30


def test_steps__a_name_taken_twice_in_one_run_fails_clearly():
    result = tasks.duplicate_steps.enqueue()
    run_tasks()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert "already taken" in result.errors[-1].traceback


def test_steps__outside_a_durable_worker_a_step_just_calls_its_function(tmp_path):
    out = tmp_path / "steps.txt"
    assert tasks.stepped.call(str(out), steps=2) == 10
    assert lines(out) == ["begin 0", "done 0", "begin 1", "done 1"]


# --- failures the worker must survive ---------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "path"),
    [("exit", "builtins.SystemExit"), ("interrupt", "builtins.KeyboardInterrupt")],
)
def test_base_exceptions__fail_the_task_and_the_worker_carries_on(kind, path):
    left = tasks.leave.enqueue(kind)
    after = tasks.add.enqueue(1, 1)
    assert run_tasks() == 2
    left.refresh()
    after.refresh()
    assert left.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in left.errors] == [path]
    assert after.return_value == 2


def test_non_retryable__a_listed_exception_fails_at_once():
    result = tasks.refuse.enqueue()
    run_tasks()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == ["builtins.PermissionError"]
    assert Job.objects.get(pk=int(result.id)).error_code == "non_retryable"


def test_invalid_path__a_job_naming_something_that_is_not_a_task_fails_clearly():
    job = jobs.enqueue(TASK_OPERATION, {"task": "os.getcwd", "args": []})
    run_tasks()
    job.refresh_from_db()
    assert job.state == "failed"
    assert job.error_code == "non_retryable"
    assert "'os.getcwd' is builtin_function_or_method, not a task" in job.reason


def test_invalid_path__a_worker_without_the_module_leaves_the_job_then_it_fails_clearly():
    job = jobs.enqueue(TASK_OPERATION, {"task": "tests.testapp.absent_module.f"})
    run_tasks()
    job.refresh_from_db()
    assert (job.state, job.attempts) == ("queued", 0)  # handed back, no attempt spent
    assert job.next_attempt_at > timezone.now()
    assert "left for a worker that has the code" in job.events.get(kind="rescheduled").message
    # After CODE_WAIT (600 s by default) since it was enqueued, it fails, saying why.
    Job.objects.filter(pk=job.pk).update(
        created_at=timezone.now() - timedelta(seconds=601), next_attempt_at=timezone.now()
    )
    run_tasks()
    job.refresh_from_db()
    assert job.state == "failed"
    assert "No module named 'tests.testapp.absent_module'" in job.reason
    assert "no worker could run the task within 600s" in job.reason


def test_invalid_path__a_nested_function_is_refused_at_enqueue():
    def inner() -> None:
        pass

    from durable.tasks.compat import Task

    with pytest.raises(InvalidTaskError, match="module level"):
        Task(priority=0, func=inner, backend="default", queue_name="default", run_after=None)


# --- transactions, operator actions, checks ---------------------------------------------


def test_transaction__a_task_enqueued_in_a_rolled_back_transaction_never_existed():
    ids = []

    def enqueue_then_fail() -> None:
        with transaction.atomic():
            ids.append(tasks.add.enqueue(1, 1).id)
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        enqueue_then_fail()
    (result_id,) = ids
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(result_id)
    assert run_tasks() == 0


def test_cancel__a_cancelled_task_is_failed_with_task_cancelled(
    signals_seen, django_capture_on_commit_callbacks
):
    result = tasks.add.enqueue(1, 1)
    with django_capture_on_commit_callbacks(execute=True):
        jobs.cancel(int(result.id), actor="alice")
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == ["durable.tasks.TaskCancelled"]
    assert "cancelled by alice" in result.errors[0].traceback
    assert signals_seen[-1] == ("finished", result.id, TaskResultStatus.FAILED)
    assert run_tasks() == 0


def test_pause__a_paused_task_is_ready_and_runs_once_resumed():
    result = tasks.add.enqueue(1, 1)
    jobs.pause(int(result.id), actor="alice")
    assert run_tasks() == 0
    result.refresh()
    assert result.status == TaskResultStatus.READY
    jobs.resume(int(result.id), actor="alice")
    run_tasks()
    result.refresh()
    assert result.return_value == 2


def test_checks__bad_options_are_a_system_check_error_and_refuse_enqueue():
    bad = {"default": {"BACKEND": "durable.tasks.DurableBackend", "OPTIONS": {"RETRIES": 3}}}
    with override_settings(TASKS=bad):
        messages = list(task_backends["default"].check())
        assert [m.id for m in messages] == ["durable.E201"]
        assert "unknown OPTIONS key 'RETRIES'" in messages[0].msg
        # On the default database only: with databases=None, Django 6.1's model checks
        # ask every configured database (this test may use only "default").
        assert any(m.id == "durable.E201" for m in checks.run_checks(databases=["default"]))
        from django.core.exceptions import ImproperlyConfigured

        with pytest.raises(ImproperlyConfigured):
            tasks.add.enqueue(1, 1)


def test_checks__a_configured_backend_passes():
    assert list(task_backends["default"].check()) == []
