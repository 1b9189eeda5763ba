"""OpenTelemetry traces: one trace per job, from the enqueuing code to its last unit,
across the process boundary and across a worker's death."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from django.test import override_settings
from opentelemetry import trace

from durable import jobs, tracing
from durable.models import Job
from tests import traces
from tests.conftest import BASE_DIR

from .helpers import drain

pytestmark = pytest.mark.django_db(transaction=True)

tracer = trace.get_tracer("tests")


def test_without_a_provider__no_context_is_stored_and_nothing_breaks(tmp_path):
    traces.uninstall()
    job = jobs.enqueue("test.append", {"units": 2, "path": str(tmp_path / "out")})
    assert Job.objects.get(pk=job.pk).trace_context == ""
    assert drain(job.pk).state == "completed"


def test_tracing_setting_off__no_span_even_with_a_provider(spans, tmp_path):
    with override_settings(DURABLE_TRACING=False):
        job = jobs.enqueue("test.append", {"units": 2, "path": str(tmp_path / "out")})
        assert drain(job.pk).state == "completed"
    assert Job.objects.get(pk=job.pk).trace_context == ""
    assert spans.get_finished_spans() == ()


def test_a_job__continues_the_trace_it_was_enqueued_in(spans, tmp_path):
    with tracer.start_as_current_span("POST /orders") as request:
        job = jobs.enqueue("test.append", {"units": 3, "path": str(tmp_path / "out")})
    stored = json.loads(Job.objects.get(pk=job.pk).trace_context)
    assert set(stored) == {"traceparent"}
    assert drain(job.pk).state == "completed"

    finished = spans.get_finished_spans()
    trace_id = request.get_span_context().trace_id
    assert {s.context.trace_id for s in finished} == {trace_id}
    (enqueue,) = traces.by_name(finished, "enqueue test.append")
    (run,) = traces.by_name(finished, "run test.append")
    units = traces.by_name(finished, "unit test.append")
    assert enqueue.parent.span_id == request.get_span_context().span_id
    assert enqueue.kind == trace.SpanKind.PRODUCER
    assert run.parent.span_id == enqueue.context.span_id
    assert run.kind == trace.SpanKind.CONSUMER
    assert dict(run.attributes) == {
        tracing.SYSTEM: "durable",
        tracing.JOB_ID: str(job.pk),
        tracing.OPERATION: "test.append",
        tracing.QUEUE: "default",
        tracing.ATTEMPT: 1,
        tracing.LEASE_EPOCH: Job.objects.get(pk=job.pk).lease_epoch,
        tracing.WORKER: "test-worker",
        tracing.OUTCOME: "completed",
    }
    assert [s.attributes[tracing.UNIT_KEY] for s in units] == ["u0", "u1", "u2"]
    assert [s.attributes[tracing.UNIT_INDEX] for s in units] == [0, 1, 2]
    assert all(s.parent.span_id == run.context.span_id for s in units)


def test_a_job_enqueued_outside_any_span__starts_its_own_trace(spans, tmp_path):
    job = jobs.enqueue("test.append", {"units": 1, "path": str(tmp_path / "out")})
    drain(job.pk)
    (enqueue,) = traces.by_name(spans.get_finished_spans(), "enqueue test.append")
    (run,) = traces.by_name(spans.get_finished_spans(), "run test.append")
    assert enqueue.parent is None
    assert run.context.trace_id == enqueue.context.trace_id


def test_enqueue_many__every_job_carries_the_callers_trace(spans, tmp_path):
    with tracer.start_as_current_span("import") as parent:
        many = jobs.enqueue_many("test.append", [{"units": 1, "path": str(tmp_path / "o")}] * 3)
    contexts = {Job.objects.get(pk=j.pk).trace_context for j in many}
    assert len(contexts) == 1
    assert contexts != {""}
    for job in many:
        drain(job.pk)
    runs = traces.by_name(spans.get_finished_spans(), "run test.append")
    assert len(runs) == 3
    assert {s.context.trace_id for s in runs} == {parent.get_span_context().trace_id}


def test_a_failed_attempt__is_an_error_span_with_the_redacted_message(spans):
    job = jobs.enqueue("test.flaky", {"fail_times": 1, "message": "refused for sk_live_secret"})
    drain(job.pk)
    runs = traces.by_name(spans.get_finished_spans(), "run test.flaky")
    assert [s.attributes[tracing.ATTEMPT] for s in runs] == [1, 2]
    first, second = runs
    assert first.status.status_code == trace.StatusCode.ERROR
    assert first.attributes[tracing.OUTCOME] == "failed"
    assert first.attributes["error.type"] == "RuntimeError"
    (event,) = [e for e in first.events if e.name == "exception"]
    stored = Job.objects.get(pk=job.pk).errors[0]["message"]
    assert event.attributes["exception.message"] == stored
    assert second.attributes[tracing.OUTCOME] == "completed"
    assert second.status.status_code != trace.StatusCode.ERROR
    (unit,) = [
        s
        for s in traces.by_name(spans.get_finished_spans(), "unit test.flaky")
        if s.parent.span_id == first.context.span_id
    ]
    assert unit.status.status_code == trace.StatusCode.ERROR
    assert unit.attributes["error.type"] == "RuntimeError"


def test_a_damaged_stored_context__gives_a_new_trace_not_an_error(spans, tmp_path):
    job = jobs.enqueue("test.append", {"units": 1, "path": str(tmp_path / "out")})
    Job.objects.filter(pk=job.pk).update(trace_context='{"traceparent": 42, "x": [')
    assert drain(job.pk).state == "completed"
    (run,) = traces.by_name(spans.get_finished_spans(), "run test.append")
    assert run.parent is None
    assert tracing.parse_context("[1]") == {}
    assert tracing.parse_context("x" * 5000) == {}


def test_a_reclaimed_attempt__is_a_new_span_of_the_same_trace(spans, workers, tmp_path):
    """SIGKILL mid-job: the killed attempt's span never ends (so it is never exported),
    its finished units are; the next worker's attempt continues the enqueuer's trace."""
    trace_file = tmp_path / "spans.jsonl"
    env = {traces.TRACE_FILE_ENV: str(trace_file)}
    with tracer.start_as_current_span("POST /jobs") as request:
        job = jobs.enqueue("test.append", {"units": 5, "path": str(tmp_path / "out")})
    crashed = workers.run(faults="after_unit:3", env=env)  # SIGKILL inside u2
    assert crashed.returncode == -signal.SIGKILL, workers.log(crashed)
    restarted = workers.run(env=env)
    assert restarted.returncode == 0, workers.log(restarted)
    job.refresh_from_db()
    assert (job.state, job.reclaims) == ("completed", 1)

    recorded = traces.read_file(trace_file)
    trace_id, _ = traces.ids(request)
    assert {s["context"]["trace_id"] for s in recorded} == {trace_id}
    (enqueue,) = traces.by_name(list(spans.get_finished_spans()), "enqueue test.append")
    (run,) = traces.by_name(recorded, "run test.append")  # the killed attempt never ended
    assert run["parent_id"] == traces.ids(enqueue)[1]
    assert run["attributes"][tracing.LEASE_EPOCH] == job.lease_epoch
    units = traces.by_name(recorded, "unit test.append")
    # u2 of the killed attempt was running when the SIGKILL came: its span never ended.
    assert [s["attributes"][tracing.UNIT_KEY] for s in units] == ["u0", "u1", "u2", "u3", "u4"]
    first = [s for s in units if s["parent_id"] != run["context"]["span_id"]]
    # Units of the killed attempt: a parent that was never exported, an older epoch.
    assert [s["attributes"][tracing.UNIT_KEY] for s in first] == ["u0", "u1"]
    (old_epoch,) = {s["attributes"][tracing.LEASE_EPOCH] for s in first}
    assert old_epoch < job.lease_epoch
    assert {s["attributes"][tracing.WORKER] for s in first} != {run["attributes"][tracing.WORKER]}


def test_without_the_opentelemetry_package__nothing_of_it_is_imported(tmp_path):
    """The extra is optional: with the package unimportable, a worker runs jobs as before."""
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "import django; django.setup()\n"
        "from durable import jobs, tracing\n"
        "from durable.worker import Worker\n"
        "from django.core.management import call_command\n"
        "call_command('migrate', verbosity=0)\n"
        "job = jobs.enqueue('durable.noop', {})\n"
        "Worker(worker_id='plain', burst=True).run(install_signal_handlers=False)\n"
        "job.refresh_from_db()\n"
        "assert job.state == 'completed', job.state\n"
        "assert not tracing.active()\n"
        "loaded = [m for m in sys.modules if m.startswith('opentelemetry') and sys.modules[m]]\n"
        "assert loaded == [], loaded\n"
        "print('ok')\n"
    )
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=BASE_DIR, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("ok")
