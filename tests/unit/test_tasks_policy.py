"""durable.tasks.policy: how a job reads as a Django task, and the tasks' options."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from durable.tasks.policy import (
    TaskOptions,
    cancel_reason,
    exception_path,
    is_non_retryable,
    missing_code,
    options_for,
    options_from_settings,
    step_key,
    task_errors,
    task_options,
    task_runs,
    task_status,
    valid_options,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("state", "status"),
    [
        ("queued", "READY"),  # enqueued, or waiting out a backoff: ready to run again
        ("paused", "READY"),  # not finished: runs again once resumed
        ("running", "RUNNING"),
        ("cancelling", "RUNNING"),  # still on its worker until the next step boundary
        ("completed", "SUCCESSFUL"),
        ("failed", "FAILED"),
        ("cancelled", "FAILED"),  # with a TaskCancelled error
    ],
)
def test_task_status__every_job_state(state, status):
    assert task_status(state) == status


@pytest.mark.parametrize(
    ("error_class", "path"),
    [
        ("ValueError", "builtins.ValueError"),  # the engine writes builtins bare
        ("myapp.errors.Oops", "myapp.errors.Oops"),
        ("builtins.KeyError", "builtins.KeyError"),
        ("WorkerLost", "durable.tasks.WorkerLost"),  # restart recovery's, after a crash
    ],
)
def test_exception_path__is_importable(error_class, path):
    from django.utils.module_loading import import_string

    assert exception_path(error_class) == path
    if not path.startswith("myapp."):
        assert issubclass(import_string(path), BaseException)


def test_task_errors__one_per_attempt_and_a_cancel_adds_task_cancelled():
    errors = [
        {"error_class": "ValueError", "message": "a", "traceback": "Traceback…ValueError: a"},
        {"error_class": "x.Y", "message": "b", "traceback": ""},  # message stands in
    ]
    found = task_errors(errors, state="failed", reason="")
    assert [(e["exception_class_path"], e["traceback"]) for e in found] == [
        ("builtins.ValueError", "Traceback…ValueError: a"),
        ("x.Y", "b"),
    ]
    cancelled = task_errors([], state="cancelled", reason="cancelled by alice")
    assert cancelled == [
        {
            "exception_class_path": "durable.tasks.TaskCancelled",
            "traceback": "cancelled by alice",
            "message": "cancelled by alice",
        }
    ]


def test_cancel_reason__names_who_asked_even_when_the_worker_finished_the_cancel():
    events = [
        ("started", {"worker": "w1"}, T0),
        ("cancel_requested", {"actor": "alice"}, T0),
        ("cancelled", {}, T0),  # written by the worker at the step boundary
    ]
    assert cancel_reason(events, "cancelled") == "cancelled by alice"
    assert cancel_reason([], "cancelled by bob") == "cancelled by bob"
    assert cancel_reason([], "") == "cancelled"


def test_task_runs__a_turned_away_claim_is_no_run():
    events = [
        ("started", {"worker": "w1"}, T0),  # ran (and crashed, or failed)
        ("started", {"worker": "old"}, T0),  # turned away: no code
        ("rescheduled", {}, T0),
        ("started", {"worker": "w2"}, T0),  # ran
    ]
    assert [run.worker_id for run in task_runs(events)] == ["w1", "w2"]
    assert task_runs([]) == []


@pytest.mark.parametrize(
    ("missing", "expected"),
    [
        ("app.tasks", True),  # the task's module
        ("app", True),  # its package: this worker runs other code
        ("requests", False),  # something the module imports: a bug, an ordinary failure
        ("app.tasks_extra", False),  # a sibling whose name merely starts the same
        (None, False),
    ],
)
def test_missing_code__only_the_tasks_own_module_or_package(missing, expected):
    assert missing_code("app.tasks.send", missing) is expected


def test_step_key__names_are_bounded():
    assert step_key("fetch") == "step:fetch"
    with pytest.raises(ValueError, match="non-empty"):
        step_key("")
    with pytest.raises(ValueError, match="longer than"):
        step_key("x" * 201)


def test_options__settings_names_map_and_unknown_ones_are_refused():
    options = options_from_settings(
        {"MAX_ATTEMPTS": 7, "BACKOFF_BASE": 1, "ON_RESTART": "retry", "NON_RETRYABLE": "a.B"}
    )
    assert options == TaskOptions(
        max_attempts=7, backoff_base=1.0, on_restart="retry", non_retryable=("a.B",)
    )
    with pytest.raises(ValueError, match="unknown OPTIONS key 'RETRIES'"):
        options_from_settings({"RETRIES": 3})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"max_attempts": 0}, "from 1 to 1000"),
        ({"max_attempts": True}, "from 1 to 1000"),  # a bool is not a count
        ({"backoff_base": -1}, "0 or more"),
        ({"on_restart": "later"}, "must be one of"),
        ({"non_retryable": [42]}, "not an exception class"),
        ({"non_retryable": ["NoDots"]}, "not an exception class"),
        ({"colour": "red"}, "unknown task option"),
    ],
)
def test_valid_options__refuses_with_the_reason(values, message):
    with pytest.raises(ValueError, match=message):
        valid_options(values)


def test_task_options__checked_at_decoration_and_layered_over_the_backend():
    with pytest.raises(ValueError, match="max_attempts"):
        task_options(max_attempts=0)

    @task_options(max_attempts=9, non_retryable=[PermissionError])
    def func() -> None:
        pass

    backend = TaskOptions(max_attempts=2, backoff_base=5.0)
    options = options_for(func, backend)
    assert (options.max_attempts, options.backoff_base) == (9, 5.0)
    assert options.non_retryable == ("builtins.PermissionError",)
    assert options_for(lambda: None, backend) == backend


def test_is_non_retryable__matches_subclasses_by_path():
    paths = ("builtins.LookupError",)
    assert is_non_retryable(KeyError("k"), paths)  # KeyError is a LookupError
    assert not is_non_retryable(ValueError("v"), paths)
    assert not is_non_retryable(KeyError("k"), ())
