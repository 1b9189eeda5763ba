"""The engine against a real database, in the test's thread (no subprocesses here)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from datetime import datetime, timedelta

import psycopg
import pytest
from django.test import TestCase
from django.utils import timezone

from durable import jobs, lease, rescue, signals, transitions
from durable.errors import InputRejected, LeaseLost, UnknownOperation
from durable.models import Job, JobEvent, UnitResult, WorkerProcess
from durable.operations import get_operation
from durable.policy import MAX_ERROR_MESSAGE_BYTES
from durable.worker import Worker
from tests.testapp.models import SideEffect

from .helpers import drain

pytestmark = pytest.mark.django_db


def seqs(job: Job) -> list[int]:
    return list(job.events.order_by("seq").values_list("seq", flat=True))


def kinds(job: Job) -> list[str]:
    return list(job.events.order_by("seq").values_list("kind", flat=True))


# --- enqueue -----------------------------------------------------------------------


def test_enqueue__persists_the_job_and_its_first_event():
    job = jobs.enqueue("test.rows", {"units": 2}, owner="alice", tenant="t1")
    job.refresh_from_db()
    assert job.state == "queued"
    assert job.input == {"units": 2}
    assert job.on_restart == "resume"
    assert job.max_attempts == 10  # the operation's default
    assert kinds(job) == ["enqueued"]
    assert job.event_seq == 1


def test_enqueue__refuses_a_credential_in_the_input():
    with pytest.raises(InputRejected) as info:
        jobs.enqueue("test.rows", {"units": 1, "api_key": "abcd1234"})
    assert info.value.field == "api_key"
    assert not Job.objects.exists()


def test_enqueue__refuses_unknown_operations_and_bad_priority():
    with pytest.raises(UnknownOperation):
        jobs.enqueue("no.such.thing", {})
    with pytest.raises(InputRejected, match="priority"):
        jobs.enqueue("test.rows", {}, priority=101)


def test_enqueue__lets_the_operation_validate_its_input():
    with pytest.raises(InputRejected, match="units"):
        jobs.enqueue("durable.noop", {"units": "many"})


def test_enqueue__unique_key_returns_the_unfinished_job_instead_of_a_second():
    first = jobs.enqueue("test.rows", {"units": 1}, unique_key="ingest:/var/x")
    again = jobs.enqueue("test.rows", {"units": 1}, unique_key="ingest:/var/x")
    assert first.created
    assert not again.created
    assert again.pk == first.pk
    drain(first.pk)
    # Once finished, the key is free again.
    later = jobs.enqueue("test.rows", {"units": 1}, unique_key="ingest:/var/x")
    assert later.created
    assert later.pk != first.pk


def test_enqueue__the_operation_s_own_unique_key_applies_to_every_caller():
    first = jobs.enqueue("test.one_per_target", {"target": "a"})
    again = jobs.enqueue("test.one_per_target", {"target": "a"})
    other = jobs.enqueue("test.one_per_target", {"target": "b"})
    assert first.unique_key == "target:a"
    assert (again.pk, again.created) == (first.pk, False)
    assert other.created
    assert other.pk != first.pk
    # A key the caller passes wins over the operation's.
    explicit = jobs.enqueue("test.one_per_target", {"target": "a"}, unique_key="mine")
    assert explicit.created
    assert explicit.unique_key == "mine"


# --- claim -------------------------------------------------------------------------


def test_claim__takes_higher_priority_first_then_the_longest_due():
    now = timezone.now()
    low = jobs.enqueue("test.rows", {}, priority=0, run_after=now - timedelta(minutes=5))
    high = jobs.enqueue("test.rows", {}, priority=10, run_after=now - timedelta(minutes=1))
    older = jobs.enqueue("test.rows", {}, priority=0, run_after=now - timedelta(minutes=9))
    order = []
    for _ in range(3):
        _, job = lease.claim("w", queues=["default"], operations=["test.rows"], lease_seconds=30)
        order.append(job.pk)
    assert order == [high.pk, older.pk, low.pk]


def test_claim__skips_jobs_not_yet_due_other_queues_and_unknown_operations():
    jobs.enqueue("test.rows", {}, run_after=timezone.now() + timedelta(minutes=5))
    jobs.enqueue("test.rows", {}, queue="other")
    jobs.enqueue("test.append", {"path": "/dev/null"})
    assert lease.claim("w", queues=["default"], operations=["test.rows"], lease_seconds=30) is None


def test_claim__increments_the_epoch_and_logs_who_took_it():
    job = jobs.enqueue("test.rows", {})
    first, _ = lease.claim("w1", queues=["default"], operations=["test.rows"], lease_seconds=30)
    transitions.release(first)
    second, claimed = lease.claim(
        "w2", queues=["default"], operations=["test.rows"], lease_seconds=30
    )
    assert second.epoch == first.epoch + 1
    assert claimed.lease_owner == "w2"
    started = JobEvent.objects.filter(job=job, kind="started").order_by("seq")
    assert [e.data["worker"] for e in started] == ["w1", "w2"]


# --- running units ------------------------------------------------------------------


def test_run__completes_every_unit_once_with_progress_and_gapless_events():
    job = jobs.enqueue("test.rows", {"units": 5})
    job = drain(job.pk)
    assert job.state == "completed"
    assert (job.units_done, job.units_total) == (5, 5)
    assert job.checkpoint == {"next": 5}
    assert job.lease_owner is None
    assert job.finished_at is not None
    assert sorted(SideEffect.objects.filter(job_id=job.pk).values_list("key", flat=True)) == [
        f"u{i}" for i in range(5)
    ]
    assert UnitResult.objects.filter(job=job).count() == 5
    assert kinds(job) == ["enqueued", "started", "completed"]
    assert seqs(job) == [1, 2, 3]


def test_run__skips_a_unit_whose_result_already_exists():
    job = jobs.enqueue("test.rows", {"units": 3})
    UnitResult.objects.create(job=job, key="u1", result={"index": 1})
    job = drain(job.pk)
    assert job.state == "completed"
    assert job.units_done == 3
    assert sorted(SideEffect.objects.filter(job_id=job.pk).values_list("key", flat=True)) == [
        "u0",
        "u2",
    ]


def test_run__resumes_from_the_persisted_checkpoint():
    job = jobs.enqueue("test.rows", {"units": 4})
    Job.objects.filter(pk=job.pk).update(checkpoint={"next": 2}, units_done=2)
    drain(job.pk)
    assert sorted(SideEffect.objects.filter(job_id=job.pk).values_list("key", flat=True)) == [
        "u2",
        "u3",
    ]


# --- fencing -------------------------------------------------------------------------


def test_fencing__a_worker_that_lost_its_lease_cannot_touch_the_job():
    job = jobs.enqueue("test.rows", {"units": 3})
    stale, _ = lease.claim("old", queues=["default"], operations=["test.rows"], lease_seconds=30)
    # The lease expires and restart recovery hands the job to another worker.
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert rescue.reclaim("rescuer") == [job.pk]
    fresh, _ = lease.claim("new", queues=["default"], operations=["test.rows"], lease_seconds=30)
    assert fresh.epoch == stale.epoch + 1

    before = Job.objects.get(pk=job.pk)
    with pytest.raises(LeaseLost):
        lease.commit_unit(stale, key="u0", result=None, checkpoint={"next": 1}, units_total=3)
    assert lease.renew(stale, 30) is None
    for settle in (transitions.complete, transitions.release, transitions.settle):
        with pytest.raises(LeaseLost):
            settle(stale)
    with pytest.raises(LeaseLost):
        transitions.record_failure(stale, {"error_class": "X", "message": "m"}, retry_at=None)
    after = Job.objects.get(pk=job.pk)
    assert (after.checkpoint, after.units_done, after.state, after.event_seq) == (
        before.checkpoint,
        before.units_done,
        "running",
        before.event_seq,
    )
    assert not UnitResult.objects.filter(job=job).exists()
    # The current holder is unaffected.
    assert (
        lease.commit_unit(fresh, key="u0", result=None, checkpoint={"next": 1}, units_total=3)
        == "running"
    )


def test_renewal__a_job_that_just_completed_is_not_reported_as_a_lost_lease(caplog):
    """The renewal thread may renew between the executor's completion and its bookkeeping."""
    from durable.operations import JobContext, get_operation
    from durable.worker import Execution, Worker

    job = jobs.enqueue("test.rows", {"units": 1})
    held, _ = lease.claim("w", queues=["default"], operations=["test.rows"], lease_seconds=30)
    worker = Worker(worker_id="w")
    ctx = JobContext(job.pk, "test.rows", {}, None, 1, "w", held.epoch)
    execution = Execution(held, ctx, get_operation("test.rows"))
    worker.executions.add(execution)
    execution.finishing = True  # what execute() sets just before it calls complete()
    transitions.complete(held)
    caplog.set_level("WARNING", logger="durable.worker")
    worker.renewer.renew_all()
    assert not execution.lost
    assert not ctx.should_stop()
    assert "lease lost" not in caplog.text


@pytest.mark.django_db(transaction=True)  # the unit commit outside any transaction, as a worker's
def test_commit__outside_a_transaction_is_fenced_extends_the_lease_and_leaves_no_transaction():
    from django.db import connection

    job = jobs.enqueue("test.append", {"units": 3})
    stale, _ = lease.claim("old", queues=["default"], operations=["test.append"], lease_seconds=1)
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert rescue.reclaim("rescuer") == [job.pk]
    fresh, _ = lease.claim("new", queues=["default"], operations=["test.append"], lease_seconds=1)
    with pytest.raises(LeaseLost):
        lease.commit_unit(stale, key="u0", result=None, checkpoint={"next": 1}, units_total=3)
    assert not connection.in_atomic_block
    assert not UnitResult.objects.filter(job=job).exists()  # the stale worker wrote nothing
    before = Job.objects.get(pk=job.pk).lease_expires_at
    state = lease.commit_unit(
        fresh, key="u0", result={"ok": 1}, checkpoint={"next": 1}, units_total=3, lease_seconds=60
    )
    assert state == "running"
    after = Job.objects.get(pk=job.pk)
    assert (after.checkpoint, after.units_done) == ({"next": 1}, 1)
    assert after.lease_expires_at > before + timedelta(seconds=30)  # the commit renewed it
    # With most of the lease left, the next commit leaves the indexed expiry as it
    # is (PostgreSQL keeps such an update HOT: no index writes per unit).
    lease.commit_unit(
        fresh, key="u1", result=None, checkpoint={"next": 2}, units_total=3, lease_seconds=60
    )
    assert Job.objects.get(pk=job.pk).lease_expires_at == after.lease_expires_at
    assert UnitResult.objects.get(job=job, key="u0").result == {"ok": 1}
    # A repeated commit of the same unit keeps the first evidence.
    lease.commit_unit(fresh, key="u0", result={"ok": 2}, checkpoint={"next": 2}, units_total=3)
    assert UnitResult.objects.get(job=job, key="u0").result == {"ok": 1}
    jobs.enqueue("test.rows", {})  # the connection is usable: no transaction left open


# --- failures and retries -------------------------------------------------------------


def test_retry__persists_the_next_attempt_before_releasing_the_job():
    job = jobs.enqueue("test.flaky", {"fail_times": 1})
    claimed = lease.claim("w", queues=["default"], operations=["test.flaky"], lease_seconds=30)
    from durable.worker import Worker

    Worker(worker_id="w").execute(*claimed)
    job.refresh_from_db()
    assert job.state == "queued"
    assert job.attempts == 1
    assert job.lease_owner is None
    failed_at = datetime.fromisoformat(job.errors[0]["at"])
    assert failed_at <= job.next_attempt_at <= failed_at + timedelta(seconds=0.05)  # backoff_max
    assert job.errors[0]["error_class"] == "RuntimeError"
    assert job.errors[0]["retryable"] is True
    assert kinds(job)[-1] == "retry_scheduled"
    job = drain(job.pk)
    assert job.state == "completed"
    assert job.attempts == 1  # failed attempts; the successful one is not counted


def test_retry__gives_up_after_max_attempts_and_keeps_the_job_failed():
    job = jobs.enqueue("test.flaky", {"fail_times": 10})
    with signals_captured(signals.job_needs_attention) as seen:
        job = drain(job.pk)
    assert job.state == "failed"
    assert job.error_code == "exhausted"
    assert job.attempts == 3
    assert len(job.errors) == 3
    assert "gave up after 3 attempts" in job.reason
    assert Job.objects.filter(pk=job.pk).exists()
    assert [s["cause"] for s in seen] == ["exhausted"]


def test_retry__exhaustion_can_pause_instead_of_fail():
    job = drain(jobs.enqueue("test.flaky_pause", {"fail_times": 10}).pk)
    assert job.state == "paused"
    assert job.error_code == "exhausted"
    assert job.finished_at is None
    # Resuming an exhausted job gives it a fresh attempt budget.
    outcome = jobs.resume(job.pk, actor="ops")
    assert outcome.applied
    job.refresh_from_db()
    assert (job.state, job.attempts) == ("queued", 0)


def test_retry__non_retryable_errors_fail_at_once():
    job = drain(jobs.enqueue("test.flaky", {"fail_times": 10, "error": "nonretryable"}).pk)
    assert job.state == "failed"
    assert job.error_code == "non_retryable"
    assert job.attempts == 1
    assert job.errors[-1]["retryable"] is False


def test_retry__retry_later_sets_the_exact_time():
    job = jobs.enqueue("test.flaky", {"fail_times": 1, "error": "retry_later", "delay": 120})
    before = timezone.now()
    drain(timeout=0.5)
    job.refresh_from_db()
    assert job.state == "queued"
    assert timedelta(seconds=119) < job.next_attempt_at - before < timedelta(seconds=122)


def test_retry__error_history_is_bounded():
    job = jobs.enqueue("test.flaky", {"fail_times": 30, "message": "x" * 10_000}, max_attempts=25)
    job = drain(job.pk, timeout=30)
    assert job.state == "failed"
    assert job.attempts == 25
    assert len(job.errors) == 20
    assert job.errors[0]["attempt"] == 6  # the oldest five were dropped
    assert all(len(e["message"].encode()) <= MAX_ERROR_MESSAGE_BYTES for e in job.errors)


def test_stopping__raised_when_nobody_asked_is_an_ordinary_failed_attempt():
    job = drain(jobs.enqueue("test.flaky", {"fail_times": 1, "error": "stopping"}).pk)
    assert job.state == "completed"
    assert job.attempts == 1  # counted, so a unit raising it unprompted cannot loop
    assert job.errors[0]["error_class"] == "durable.errors.Stopping"


@pytest.mark.django_db(transaction=True)  # the renewal runs on its own connection
def test_stopping__a_unit_stopping_early_after_a_pause_leaves_the_job_paused(tmp_path):
    import threading

    from django.db import connection

    from durable.worker import Worker

    out = tmp_path / "x"
    job = jobs.enqueue(
        "test.append", {"units": 2, "path": str(out), "cooperative": True, "sleep": 5}
    )
    claimed = lease.claim("w", queues=["default"], operations=["test.append"], lease_seconds=30)
    worker = Worker(worker_id="w")

    def operator_pauses_then_renewal_notices() -> None:
        while not out.exists():
            time.sleep(0.01)
        assert jobs.pause(job.pk, actor="ops").applied
        worker.renewer.renew_all()  # one round of the renewal thread: sees "paused"
        connection.close()

    helper = threading.Thread(target=operator_pauses_then_renewal_notices)
    helper.start()
    started = time.monotonic()
    worker.execute(*claimed)
    helper.join(10)
    assert time.monotonic() - started < 3  # the unit stopped, it did not sleep out 5 s
    job.refresh_from_db()
    assert (job.state, job.lease_owner, job.attempts, job.units_done) == ("paused", None, 0, 0)
    assert job.checkpoint is None
    assert "done" not in out.read_text()


def test_gate__repeated_turn_aways_keep_one_event_and_spend_no_attempt():
    job = drain(jobs.enqueue("test.gated", {"turn_aways": 6}).pk)
    assert (job.state, job.attempts) == ("completed", 0)
    assert SideEffect.objects.filter(job_id=job.pk, key="try").count() == 7
    # Not six (started, rescheduled) pairs: the log stays bounded behind a gate.
    assert kinds(job) == ["enqueued", "started", "rescheduled", "started", "completed"]
    assert seqs(job) == [1, 2, 3, 4, 5]
    turned_away = job.events.get(kind="rescheduled")
    assert turned_away.data["turn_aways"] == 6
    # The first few distinct reasons, bounded; the latest one apart.
    assert turned_away.message == " | ".join(f"gate closed (try {n})" for n in range(1, 5))
    assert turned_away.data["last_message"] == "gate closed (try 6)"


def test_gate__a_turn_away_after_real_progress_is_recorded_on_its_own():
    job = jobs.enqueue("test.gated", {"turn_aways": 2})
    held, _ = lease.claim("w", queues=["default"], operations=["test.gated"], lease_seconds=30)
    entry = {"error_class": "GateClosed", "message": "closed"}
    now = timezone.now()
    transitions.record_failure(held, entry, retry_at=now, consume_attempt=False, coalesce=True)
    held, _ = lease.claim("w", queues=["default"], operations=["test.gated"], lease_seconds=30)
    # This lease committed a unit: its started event stays, the turn-away gets its own.
    transitions.record_failure(held, entry, retry_at=now, consume_attempt=False, coalesce=False)
    assert kinds(job) == ["enqueued", "started", "rescheduled", "started", "rescheduled"]


def test_failure__while_cancelling_keeps_its_error_and_attempt():
    job = jobs.enqueue("test.rows", {"units": 3})
    held, _ = lease.claim("w", queues=["default"], operations=["test.rows"], lease_seconds=30)
    assert jobs.cancel(job.pk, actor="ops").state == "cancelling"
    entry = {"error_class": "RuntimeError", "message": "boom", "attempt": 1}
    transitions.record_failure(held, entry, retry_at=timezone.now())
    job.refresh_from_db()
    assert (job.state, job.attempts, job.last_error_class) == ("cancelled", 1, "RuntimeError")
    assert job.errors == [entry]


def test_unavailable__pauses_with_an_actionable_reason_and_spends_no_attempt():
    job = drain(jobs.enqueue("test.needs_credential", {"token_ref": "missing-one"}).pk)
    assert job.state == "paused"
    assert job.attempts == 0
    assert job.error_code == "unavailable"
    assert "DURABLE_CREDENTIAL_MISSING_ONE" in job.reason


def test_credentials__resolved_at_run_time_and_never_persisted(settings):
    secret = "tok-9f8e7d6c5b4a"
    settings.DURABLE_CREDENTIALS = {"ci": secret}
    ok = drain(jobs.enqueue("test.needs_credential", {"token_ref": "ci"}).pk)
    assert ok.state == "completed"
    leaky = jobs.enqueue("test.needs_credential", {"token_ref": "ci", "leak": True}, max_attempts=1)
    leaky = drain(leaky.pk)
    assert leaky.state == "failed"
    assert "[redacted]" in leaky.errors[0]["message"]
    for job in Job.objects.all():
        blob = repr(
            (job.input, job.checkpoint, job.errors, job.reason, list(job.events.values()),
             list(job.unit_results.values()))
        )  # fmt: skip
        assert secret not in blob


# --- operator actions ----------------------------------------------------------------


def test_actions__pause_resume_cancel_on_a_queued_job():
    job = jobs.enqueue("test.rows", {})
    assert jobs.pause(job.pk, actor="ops").applied
    assert lease.claim("w", queues=["default"], operations=["test.rows"], lease_seconds=30) is None
    assert jobs.resume(job.pk, actor="ops").applied
    assert jobs.cancel(job.pk, actor="ops").applied
    job.refresh_from_db()
    assert job.state == "cancelled"
    assert job.finished_at is not None
    assert kinds(job) == ["enqueued", "paused", "resumed", "cancelled"]
    assert job.events.get(kind="paused").data["actor"] == "ops"


def test_actions__a_double_click_changes_nothing_twice():
    job = jobs.enqueue("test.rows", {})
    first, second = jobs.pause(job.pk), jobs.pause(job.pk)
    assert first.applied
    assert not second.applied
    assert not second.refused
    assert kinds(job) == ["enqueued", "paused"]


def test_actions__refused_transitions_say_why_and_change_nothing():
    job = drain(jobs.enqueue("test.rows", {"units": 1}).pk)
    outcome = jobs.cancel(job.pk)
    assert outcome.refusal == "a completed job cannot be cancelled"
    job.refresh_from_db()
    assert job.state == "completed"
    assert jobs.act("pause", [999_999])[0].refusal == "no such job"


def test_actions__retry_now_requeues_a_failed_job_from_its_checkpoint():
    job = drain(jobs.enqueue("test.flaky", {"fail_times": 10}).pk)
    Job.objects.filter(pk=job.pk).update(checkpoint={"note": "kept"})
    assert jobs.retry_now(job.pk, actor="ops").applied
    job.refresh_from_db()
    assert (job.state, job.attempts, job.checkpoint, job.finished_at) == (
        "queued",
        0,
        {"note": "kept"},
        None,
    )


def test_actions__retry_now_skips_the_backoff_of_a_waiting_job():
    job = jobs.enqueue("test.rows", {}, run_after=timezone.now() + timedelta(hours=1))
    assert jobs.retry_now(job.pk).applied
    job.refresh_from_db()
    assert job.next_attempt_at <= timezone.now()


def test_actions__retry_now_twice_on_a_waiting_job_writes_one_event():
    job = drain(jobs.enqueue("test.flaky", {"fail_times": 10}).pk)  # failed, exhausted
    first, second = jobs.retry_now(job.pk), jobs.retry_now(job.pk)
    assert first.applied
    assert (second.applied, second.refused, second.state) == (False, False, "queued")
    assert kinds(job).count("retried") == 1


def test_actions__retry_now_of_a_job_already_due_is_already_so():
    job = jobs.enqueue("test.rows", {})
    outcome = jobs.retry_now(job.pk, actor="ops")
    assert (outcome.applied, outcome.refused) == (False, False)
    assert kinds(job) == ["enqueued"]


class _ClockAhead:
    """A web server whose clock runs a minute ahead of the database's."""

    @staticmethod
    def now() -> datetime:
        return timezone.now() + timedelta(seconds=60)


def test_actions__a_live_lease_is_judged_on_the_database_clock(monkeypatch):
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("SQLite: workers and web server share one machine's clock")
    job = jobs.enqueue("test.rows", {"units": 3})
    lease.claim("w", queues=["default"], operations=["test.rows"], lease_seconds=30)
    assert jobs.pause(job.pk).applied  # the worker keeps its lease until the unit boundary
    monkeypatch.setattr(jobs, "timezone", _ClockAhead)
    outcome = jobs.resume(job.pk, actor="ops")
    job.refresh_from_db()
    # Still held by the worker (30 s by the database's clock): it simply carries on.
    # Judged on the web server's clock it would go back to the queue with its
    # lease dropped, while the worker is still running it.
    assert (outcome.state, job.state, job.lease_owner) == ("running", "running", "w")


def test_actions__resume_while_the_worker_still_holds_it_clears_the_pause_reason():
    job = jobs.enqueue("test.rows", {"units": 3})
    lease.claim("w", queues=["default"], operations=["test.rows"], lease_seconds=30)
    assert jobs.pause(job.pk, actor="ops").applied
    job.refresh_from_db()
    assert job.reason == "paused by ops"
    assert jobs.resume(job.pk, actor="ops").applied
    job.refresh_from_db()
    assert (job.state, job.reason) == ("running", "")


def test_actions__a_pause_during_the_last_unit_is_honoured_not_completed():
    job = drain(jobs.enqueue("test.act", {"units": 2, "act_at": 1, "action": "pause"}).pk)
    assert (job.state, job.lease_owner, job.units_done) == ("paused", None, 2)
    assert "completed" not in kinds(job)
    assert jobs.resume(job.pk, actor="ops").applied
    job = drain(job.pk)
    assert (job.state, job.reason) == ("completed", "")
    assert SideEffect.objects.filter(job_id=job.pk).count() == 2  # nothing ran twice


def test_actions__pause_of_a_running_job_takes_effect_at_the_unit_boundary():
    job = drain(jobs.enqueue("test.act", {"units": 4, "act_at": 1, "action": "pause"}).pk)
    assert job.state == "paused"
    assert job.lease_owner is None
    # The unit that was running when the pause arrived finished and was checkpointed.
    assert job.checkpoint == {"next": 2}
    assert SideEffect.objects.filter(job_id=job.pk).count() == 2
    assert jobs.resume(job.pk).applied
    Job.objects.filter(pk=job.pk).update(input={"units": 4, "act_at": -1, "action": "pause"})
    job = drain(job.pk)
    assert job.state == "completed"
    assert SideEffect.objects.filter(job_id=job.pk).count() == 4


def test_actions__cancel_of_a_running_job_stops_at_the_next_boundary():
    job = drain(jobs.enqueue("test.act", {"units": 4, "act_at": 1, "action": "cancel"}).pk)
    assert job.state == "cancelled"
    assert SideEffect.objects.filter(job_id=job.pk).count() == 2
    assert "completed" not in kinds(job)
    assert kinds(job)[-2:] == ["cancel_requested", "cancelled"]


def test_actions__bulk_covers_many_jobs_in_batches():
    created = [jobs.enqueue("test.rows", {}).pk for _ in range(25)]
    outcomes = jobs.act("pause", created, actor="ops", batch_size=7)
    assert sum(o.applied for o in outcomes) == 25
    assert Job.objects.filter(state="paused").count() == 25


# --- restart recovery ------------------------------------------------------------------


def leased(job: Job, *, state: str, owner: str = "dead-worker", expired: bool = True) -> Job:
    Job.objects.filter(pk=job.pk).update(
        state=state,
        lease_owner=owner,
        lease_epoch=1,
        lease_expires_at=timezone.now() + timedelta(seconds=-5 if expired else 60),
        checkpoint={"next": 2},
        units_done=2,
    )
    return Job.objects.get(pk=job.pk)


@pytest.mark.parametrize(
    ("policy", "state", "expected_state", "expected_checkpoint", "code"),
    [
        ("fail", "running", "failed", {"next": 2}, "server_restarted"),
        ("retry", "running", "queued", None, ""),
        ("resume", "running", "queued", {"next": 2}, ""),
        ("fail", "cancelling", "cancelled", {"next": 2}, "cancelled"),
        ("retry", "cancelling", "cancelled", {"next": 2}, "cancelled"),
        ("resume", "cancelling", "cancelled", {"next": 2}, "cancelled"),
    ],
)
def test_restart_policy__spec_table_for_jobs_of_a_stopped_worker(
    policy, state, expected_state, expected_checkpoint, code
):
    job = leased(jobs.enqueue("test.rows", {"units": 4}, on_restart=policy), state=state)
    UnitResult.objects.create(job=job, key="u0")
    with signals_captured(signals.job_reclaimed) as seen:
        assert rescue.reclaim("me") == [job.pk]
    job.refresh_from_db()
    assert job.state == expected_state
    assert job.checkpoint == expected_checkpoint
    assert job.error_code == code
    assert job.lease_owner is None
    assert seqs(job) == list(range(1, job.event_seq + 1))
    assert seen[0]["previous_owner"] == "dead-worker"
    assert seen[0]["new_state"] == expected_state
    assert seen[0]["checkpoint"] == {"next": 2}  # where it was, even when retry drops it
    # "retry" starts over: its unit results go too, so every unit runs again.
    assert UnitResult.objects.filter(job=job).exists() is (policy != "retry" or state != "running")


def test_restart_policy__reclaimed_jobs_are_spread_out_not_all_due_at_once():
    created = [jobs.enqueue("test.rows", {}) for _ in range(8)]
    for job in created:
        leased(job, state="running")
    assert len(rescue.reclaim("me")) == 8
    # Each job's delay after the moment it was taken back (its updated_at).
    delays = sorted(
        (due - taken_back).total_seconds()
        for due, taken_back in Job.objects.values_list("next_attempt_at", "updated_at")
    )
    assert delays[0] == 0  # the first one is due at once
    assert delays[-1] > 0  # the others are spread with jitter...
    assert delays[-1] <= 0.7  # ... within 0.1 s per job already taken back


def test_restart_policy__a_live_lease_is_left_alone():
    job = leased(jobs.enqueue("test.rows", {}), state="running", expired=False)
    assert rescue.reclaim("me") == []
    job.refresh_from_db()
    assert job.state == "running"


def test_restart_policy__a_paused_job_only_loses_its_stale_lease():
    job = leased(jobs.enqueue("test.rows", {}), state="paused")
    rescue.reclaim("me")
    job.refresh_from_db()
    assert (job.state, job.lease_owner) == ("paused", None)


def test_restart_policy__a_job_that_keeps_killing_its_worker_is_stopped():
    job = jobs.enqueue("test.rows", {}, max_attempts=2)
    Job.objects.filter(pk=job.pk).update(attempts=1)
    job = leased(job, state="running")
    rescue.reclaim("me")
    job.refresh_from_db()
    assert (job.state, job.error_code) == ("failed", "exhausted")
    assert "may be what crashes the worker" in job.reason


def test_restart_policy__a_worker_lost_after_progress_is_recorded_but_spends_no_attempt():
    job = jobs.enqueue("test.rows", {"units": 4}, max_attempts=1)
    job = leased(job, state="running")  # units_done 2 ...
    Job.objects.filter(pk=job.pk).update(units_at_claim=1)  # ... of which 1 under this lease
    with signals_captured(signals.job_reclaimed) as seen:
        assert rescue.reclaim("me") == [job.pk]
    job.refresh_from_db()
    # One attempt allowed, yet the job goes on: the death came after progress.
    assert (job.state, job.attempts, job.reclaims) == ("queued", 0, 1)
    assert job.checkpoint == {"next": 2}
    entry = job.errors[-1]
    assert (entry["error_class"], entry["attempt_spent"], entry["units_committed"]) == (
        "WorkerLost",
        False,
        1,
    )
    assert "after committing 1 unit(s)" in entry["message"]
    event = job.events.get(kind="reclaimed")
    assert (event.data["attempt_spent"], event.data["units_committed"]) == (False, 1)
    assert "no attempt spent" in event.message
    assert (seen[0]["attempt_spent"], seen[0]["units_committed"]) == (False, 1)


def test_restart_policy__a_worker_lost_before_any_commit_spends_an_attempt_and_says_so():
    job = jobs.enqueue("test.rows", {"units": 4}, max_attempts=2)
    job = leased(job, state="running")
    Job.objects.filter(pk=job.pk).update(units_at_claim=2)  # nothing committed since the claim
    with signals_captured(signals.job_reclaimed) as seen:
        rescue.reclaim("me")
    job.refresh_from_db()
    assert (job.state, job.attempts) == ("queued", 1)
    assert job.errors[-1]["attempt_spent"] is True
    assert "before committing a unit" in job.errors[-1]["message"]
    assert seen[0]["attempt_spent"] is True
    # The second such death exhausts it; the reason counts the deaths without progress.
    leased(job, state="running")
    Job.objects.filter(pk=job.pk).update(units_at_claim=2, lease_epoch=2)
    rescue.reclaim("me")
    job.refresh_from_db()
    assert (job.state, job.attempts, job.error_code) == ("failed", 2, "exhausted")
    assert job.reason.startswith("its worker stopped 2 times without committing a unit")
    assert "may be what crashes the worker" in job.reason


def test_restart_policy__retry_from_the_start_counts_a_death_despite_progress():
    job = jobs.enqueue("test.rows", {"units": 4}, max_attempts=1, on_restart="retry")
    job = leased(job, state="running")
    Job.objects.filter(pk=job.pk).update(units_at_claim=0)
    rescue.reclaim("me")
    job.refresh_from_db()
    # Its progress was dropped with the checkpoint: that death was a whole failed attempt.
    assert (job.state, job.attempts, job.error_code) == ("failed", 1, "exhausted")


def test_restart_policy__cold_start_fails_queued_fail_jobs_left_by_the_previous_fleet():
    left_over = jobs.enqueue("test.rows", {}, on_restart="fail")
    kept = jobs.enqueue("test.rows", {}, on_restart="resume")
    WorkerProcess.objects.create(
        worker_id="gone",
        hostname="h",
        pid=1,
        heartbeat_at=timezone.now() + timedelta(seconds=1) - timedelta(minutes=5),
    )
    Job.objects.filter(pk__in=[left_over.pk, kept.pk]).update(
        created_at=timezone.now() - timedelta(minutes=10)
    )
    queued_later = jobs.enqueue("test.rows", {}, on_restart="fail")  # after the fleet died
    report = rescue.recover_at_startup("fresh", queues=["default"], concurrency=1, lease_seconds=30)
    assert report.cold_start
    assert report.failed_queued == [left_over.pk]
    states = dict(Job.objects.values_list("pk", "state"))
    assert states == {left_over.pk: "failed", kept.pk: "queued", queued_later.pk: "queued"}
    assert Job.objects.get(pk=left_over.pk).error_code == "server_restarted"


def test_startup__a_retry_after_an_answer_lost_in_an_outage_judges_as_the_first_try():
    """The first try committed (its row is there) but its answer never came: the worker
    tries again with the same id. No duplicate-key crash, and it is still a cold start:
    its own row is not a live peer."""
    left_over = jobs.enqueue("test.rows", {}, on_restart="fail")
    Job.objects.filter(pk=left_over.pk).update(created_at=timezone.now() - timedelta(minutes=10))
    WorkerProcess.objects.create(
        worker_id="gone", hostname="h", pid=1, heartbeat_at=timezone.now() - timedelta(minutes=5)
    )
    rescue.register_worker("fresh", queues=["default"], concurrency=1, lease_seconds=30)
    report = rescue.recover_at_startup("fresh", queues=["default"], concurrency=1, lease_seconds=30)
    assert report.cold_start
    assert report.failed_queued == [left_over.pk]
    assert WorkerProcess.objects.filter(worker_id="fresh").count() == 1


def test_outage__claims_whose_answer_was_lost_are_handed_back_once_the_database_is_back():
    """A claim that committed while the connection was cut never reached its thread. After
    the outage the renewer hands such jobs back at once (no attempt spent), and leaves
    alone the jobs its threads hold and the jobs claimed since the outage began."""
    worker = Worker(worker_id="w-outage", lease_seconds=30)
    ops = ["test.rows"]
    swallowed, held = (jobs.enqueue("test.rows", {}).pk for _ in range(2))
    for job_id in (swallowed, held):
        assert lease.claim("w-outage", queues=["default"], operations=ops, lease_seconds=30,
                           job_id=job_id)  # fmt: skip
    worker.executions.hold([held])
    time.sleep(0.01)
    worker.watch.failed(psycopg.OperationalError("the connection is closed"), "claim failed")
    later = jobs.enqueue("test.rows", {}).pk
    assert lease.claim("w-outage", queues=["default"], operations=ops, lease_seconds=30,
                       job_id=later)  # fmt: skip
    worker.executions.hold([later])
    worker.renewer.hand_back_strays()  # still down: nothing to look back on yet
    assert Job.objects.get(pk=swallowed).state == "running"
    worker.watch.succeeded()
    worker.executions.let_go(later)  # finished with by now; claimed after the outage began
    worker.renewer.hand_back_strays()
    states = dict(Job.objects.filter(pk__in=[swallowed, held, later]).values_list("pk", "state"))
    assert states == {swallowed: "queued", held: "running", later: "running"}
    job = Job.objects.get(pk=swallowed)
    assert (job.attempts, job.lease_owner) == (0, None)
    assert JobEvent.objects.filter(job_id=swallowed, kind="released").exists()
    worker.renewer.hand_back_strays()  # once per outage
    assert JobEvent.objects.filter(job_id=swallowed, kind="released").count() == 1


def test_restart_policy__a_worker_joining_live_peers_is_not_a_cold_start():
    WorkerProcess.objects.create(worker_id="peer", hostname="h", pid=1, heartbeat_at=timezone.now())
    job = jobs.enqueue("test.rows", {}, on_restart="fail")
    report = rescue.recover_at_startup("fresh", queues=["default"], concurrency=1, lease_seconds=30)
    assert not report.cold_start
    job.refresh_from_db()
    assert job.state == "queued"


def test_restart_policy__a_peer_with_a_longer_lease_is_alive_between_its_heartbeats():
    # The peer runs with 90 s leases and beats every 30 s; 20 s of silence is normal.
    WorkerProcess.objects.create(
        worker_id="slow-peer",
        hostname="h",
        pid=1,
        lease_seconds=90,
        heartbeat_at=timezone.now() - timedelta(seconds=20),
    )
    job = jobs.enqueue("test.rows", {}, on_restart="fail")
    Job.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(minutes=1))
    report = rescue.recover_at_startup("fresh", queues=["default"], concurrency=1, lease_seconds=10)
    assert not report.cold_start
    job.refresh_from_db()
    assert job.state == "queued"  # not failed with server_restarted under a live peer
    assert WorkerProcess.objects.get(worker_id="fresh").lease_seconds == 10


def test_registry__a_worker_of_the_previous_release_can_still_register():
    """Rolling deploy: the old code inserts worker rows without lease_seconds."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO durable_workerprocess (worker_id, hostname, pid, host_key, queues, "
            "concurrency, started_at, heartbeat_at) VALUES (%s, 'h', 1, '', '[]', 1, %s, %s)",
            ["old-release", timezone.now(), timezone.now()],
        )
    assert WorkerProcess.objects.get(worker_id="old-release").lease_seconds == 30


def test_restart_policy__a_dead_local_worker_is_reclaimed_without_waiting_for_its_lease():
    WorkerProcess.objects.create(
        worker_id="crashed", hostname="h", pid=2**22 + 12345, host_key=rescue.host_key()
    )
    job = leased(jobs.enqueue("test.rows", {}), state="running", owner="crashed", expired=False)
    assert rescue.reclaim("me") == [job.pk]
    assert WorkerProcess.objects.get(worker_id="crashed").stopped_at is not None


# --- retention --------------------------------------------------------------------------


def test_purge__deletes_old_finished_jobs_and_never_unfinished_ones():
    old = timezone.now() - timedelta(days=40)
    finished = []
    for state in ("completed", "failed", "cancelled"):
        job = jobs.enqueue("test.rows", {})
        Job.objects.filter(pk=job.pk).update(state=state, finished_at=old, created_at=old)
        finished.append(job.pk)
    unfinished = []
    for state in ("queued", "running", "paused", "cancelling"):
        job = jobs.enqueue("test.rows", {})
        # An old finished_at too (a job retried after it finished keeps one), so
        # only the state can keep these: the test fails if that check goes.
        Job.objects.filter(pk=job.pk).update(
            state=state, created_at=old, updated_at=old, finished_at=old
        )
        unfinished.append(job.pk)
    recent = jobs.enqueue("test.rows", {})
    Job.objects.filter(pk=recent.pk).update(state="completed", finished_at=timezone.now())
    purge = drain(jobs.enqueue("durable.purge", {"older_than": "30d"}).pk)
    assert purge.state == "completed"
    remaining = set(Job.objects.values_list("pk", flat=True))
    assert not remaining & set(finished)
    assert set(unfinished) <= remaining
    assert recent.pk in remaining
    assert not JobEvent.objects.filter(job_id__in=finished).exists()


@pytest.mark.django_db(transaction=True)  # an operator's action on another connection
def test_purge__a_job_retried_while_its_batch_is_being_deleted_is_kept():
    """The window: after the purge chose its batch, before it deleted it."""
    import threading

    from django.db import connection, transaction
    from django.db.models.signals import post_init

    old = timezone.now() - timedelta(days=40)
    job = drain(jobs.enqueue("test.flaky", {"fail_times": 10}).pk)  # failed
    Job.objects.filter(pk=job.pk).update(finished_at=old)
    purge = jobs.enqueue("durable.purge", {"older_than": "30d"})
    in_window, retried = threading.Event(), threading.Event()
    outcome = {}

    def operator_retries() -> None:
        try:
            with transaction.atomic():
                outcome["retry"] = jobs.retry_now(job.pk, actor="ops")
                in_window.wait(2)  # commit while the purge is between its read and its delete
        finally:
            retried.set()
            connection.close()

    def purge_loaded_a_job(sender, instance, **kwargs) -> None:
        # Django's delete() loads the rows it will delete; this is the window.
        if threading.current_thread() is threading.main_thread() and instance.pk == job.pk:
            in_window.set()
            retried.wait(5)

    operator = threading.Thread(target=operator_retries)
    post_init.connect(purge_loaded_a_job, sender=Job)
    try:
        operator.start()
        time.sleep(0.2)  # the operator's transaction holds the job's row now
        purge = drain(purge.pk)
    finally:
        post_init.disconnect(purge_loaded_a_job, sender=Job)
        in_window.set()
        operator.join(10)
    assert outcome["retry"].applied
    assert (purge.state, purge.attempts) == ("completed", 0)
    job.refresh_from_db()  # still there
    assert job.state == "queued"
    assert kinds(job)[-1] == "retried"


def test_purge__the_command_defaults_to_the_retention_setting(settings, capsys):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    settings.DURABLE_RETENTION = "12h"
    call_command("purge_jobs", "--enqueue")
    assert Job.objects.get(operation="durable.purge").input == {"older_than": "12h"}
    settings.DURABLE_RETENTION = "off"
    with pytest.raises(CommandError, match="--older-than"):
        call_command("purge_jobs")


def test_purge__only_privileged_users_may_start_it_by_hand():
    from durable.operations import may_start

    op = get_operation("durable.purge")
    assert not may_start(op, privileged=False)
    assert may_start(op, privileged=True)


def test_purge__refuses_a_nonsense_age():
    with pytest.raises(InputRejected, match="older_than"):
        jobs.enqueue("durable.purge", {"older_than": "soon"})


# --- helpers ----------------------------------------------------------------------------


@contextmanager
def signals_captured(signal):
    """Collect a signal's keyword arguments; on-commit sends run at once here."""
    seen: list[dict] = []

    def receiver(sender, **kwargs):
        seen.append(kwargs)

    signal.connect(receiver)
    try:
        with TestCase.captureOnCommitCallbacks(execute=True):
            yield seen
    finally:
        signal.disconnect(receiver)


def test_logs__one_structured_line_per_state_change(caplog):
    caplog.set_level("INFO", logger="durable")
    job = drain(jobs.enqueue("test.rows", {"units": 2}).pk)
    lines = [
        r for r in caplog.records if getattr(r, "job", None) == job.pk and r.name == "durable.jobs"
    ]
    assert [r.getMessage() for r in lines] == ["enqueued", "started", "completed"]
    last = lines[-1]
    assert (last.operation, last.state, last.attempt, last.checkpoint) == (
        "test.rows",
        "completed",
        0,
        {"next": 2},
    )
    from durable.logs import LogfmtFormatter

    text = LogfmtFormatter().format(last)
    assert f"job={job.pk}" in text
    assert 'checkpoint="{\\"next\\":2}"' in text
    assert "state=completed" in text
