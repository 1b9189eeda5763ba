"""Issue 23: one commit per job — the transaction that finishes a thread's job claims its next.

``lease.finish_unit(..., then=NextClaim)``: PostgreSQL one statement, SQLite one write
transaction. The claim is gated on the finish having applied; the worker asks for it
only while it is not stopping and a ``--max-jobs`` slot is free.
"""

from __future__ import annotations

import itertools
import signal
import time

import pytest
from django.db.models import F

from durable import jobs
from durable.errors import LeaseLost
from durable.lease import NextClaim, claim, finish_unit
from durable.models import Job, JobEvent, PausedQueue, UnitResult
from durable.operations import registered
from durable.worker import Worker
from tests.conftest import wait_until

from .test_small_jobs import driver_log, summary

pytestmark = pytest.mark.django_db(transaction=True)

NOOP = ["durable.noop"]


def _claim_one(owner: str = "w", queues: list[str] | None = None):
    claimed = claim(owner, queues=queues or ["default"], operations=NOOP, lease_seconds=30)
    assert claimed is not None
    return claimed


def _finish(lease, then: NextClaim | None):
    return finish_unit(
        lease, key="n:0", result=None, checkpoint={"next": 1}, units_total=1,
        operation="durable.noop", attempts=0, then=then,
    )  # fmt: skip


def _gapless(job: Job) -> bool:
    seqs = list(job.events.order_by("seq").values_list("seq", flat=True))
    return seqs == list(range(1, job.event_seq + 1))


def test_statements__finish_and_claim_is_one_statement_one_transaction():
    """PostgreSQL: the finish and the next claim are one statement, its own transaction.
    SQLite: one write transaction of four statements (the finish's UPDATE and unit
    result, the claim's UPDATE, one INSERT of both events). Before issue 23 a one-unit
    job cost two transactions: its finish, then the next claim."""
    first = jobs.enqueue("durable.noop", {"units": 1})
    second = jobs.enqueue("durable.noop", {"units": 1})
    lease, _ = _claim_one()
    with driver_log() as log:
        ended = _finish(lease, NextClaim("w", ["default"], NOOP, 30))
    expected = (1, 1) if _vendor() == "postgresql" else (4, 1)
    assert summary(log) == expected, log
    assert ended.state == "completed"
    assert ended.next is not None
    next_lease, next_job = ended.next
    assert next_job.pk == second.pk
    assert next_job.state == "running"
    assert (next_lease.job_id, next_lease.epoch, next_job.has_results) == (second.pk, 1, False)
    for job in (first, second):
        job.refresh_from_db()
        assert _gapless(job)
    assert (first.state, first.lease_owner) == ("completed", None)
    assert (second.state, second.lease_owner, second.event_seq) == ("running", "w", 2)
    assert second.started_at == first.finished_at  # one transaction, one moment
    assert list(second.events.values_list("kind", "data")) == [
        ("enqueued", {"owner": "", "queue": "default"}),
        ("started", {"worker": "w", "epoch": 1, "attempt": 1}),
    ]


def _vendor() -> str:
    from django.db import connection

    return connection.vendor


def test_a_lost_lease_claims_nothing():
    job = jobs.enqueue("durable.noop", {"units": 1})
    waiting = jobs.enqueue("durable.noop", {"units": 1})
    lease, _ = _claim_one()
    Job.objects.filter(pk=job.pk).update(lease_epoch=F("lease_epoch") + 1)  # taken back
    with pytest.raises(LeaseLost):
        _finish(lease, NextClaim("w", ["default"], NOOP, 30))
    waiting.refresh_from_db()
    assert (waiting.state, waiting.lease_owner, waiting.lease_epoch) == ("queued", None, 0)
    assert list(waiting.events.values_list("kind", flat=True)) == ["enqueued"]
    assert not UnitResult.objects.filter(job=job).exists()


def test_nothing_due__the_finish_commits_alone():
    jobs.enqueue("durable.noop", {"units": 1})
    later = jobs.enqueue("durable.noop", {"units": 1}, run_after=_in_an_hour())
    lease, _ = _claim_one()
    ended = _finish(lease, NextClaim("w", ["default"], NOOP, 30))
    assert (ended.state, ended.next) == ("completed", None)
    later.refresh_from_db()
    assert later.state == "queued"


def _in_an_hour():
    from datetime import timedelta

    from django.utils import timezone

    return timezone.now() + timedelta(hours=1)


def test_the_claim_keeps_the_claim_order_and_skips_paused_queues():
    jobs.enqueue("durable.noop", {"units": 1}, priority=9)  # the finishing one
    low = jobs.enqueue("durable.noop", {"units": 1}, priority=0)
    high = jobs.enqueue("durable.noop", {"units": 1}, priority=5, queue="other")
    jobs.enqueue("durable.noop", {"units": 1}, priority=8, queue="mail")
    PausedQueue.objects.create(queue="mail")
    lease, _ = _claim_one(queues=["default", "other", "mail"])
    then = NextClaim("w", ["default", "other", "mail"], NOOP, 30)
    ended = _finish(lease, then)
    assert ended.next is not None
    assert ended.next[1].pk == high.pk
    ended = _finish(ended.next[0], then)
    assert ended.next is not None
    assert ended.next[1].pk == low.pk
    assert _finish(ended.next[0], then).next is None  # the paused queue's job stays
    assert Job.objects.filter(queue="mail", state="queued").count() == 1


def test_never_inside_a_callers_transaction():
    from django.db import transaction

    jobs.enqueue("durable.noop", {"units": 1})
    waiting = jobs.enqueue("durable.noop", {"units": 1})
    lease, _ = _claim_one()
    with transaction.atomic():
        ended = _finish(lease, NextClaim("w", ["default"], NOOP, 30))
    assert (ended.state, ended.next) == ("completed", None)
    waiting.refresh_from_db()
    assert waiting.state == "queued"


def test_a_cancel_during_the_last_unit_wins_and_the_next_job_still_runs(workers):
    cancelled = jobs.enqueue("test.act", {"units": 2, "act_at": 1, "action": "cancel"})
    after = jobs.enqueue("durable.noop", {"units": 1})
    proc = workers.run("--concurrency", "1")
    assert proc.returncode == 0, workers.log(proc)
    cancelled.refresh_from_db()
    after.refresh_from_db()
    assert (cancelled.state, cancelled.units_done, cancelled.lease_owner) == ("cancelled", 2, None)
    assert (after.state, after.lease_epoch) == ("completed", 1)
    assert after.started_at == cancelled.finished_at  # claimed by the cancelled job's finish
    assert _gapless(cancelled)
    assert _gapless(after)


@pytest.mark.slow
def test_a_chain__every_job_after_the_first_is_claimed_by_its_predecessors_finish(workers):
    """One thread, 30 one-unit jobs: one claim at the desk, then 29 claims each made by
    the finish of the job before it (its ``started_at`` is that finish's moment)."""
    made = jobs.enqueue_many("durable.noop", [{"units": 1}] * 30)
    proc = workers.run("--concurrency", "1")
    assert proc.returncode == 0, workers.log(proc)
    done = list(Job.objects.filter(pk__in=[job.pk for job in made]).order_by("started_at"))
    assert [job.state for job in done] == ["completed"] * 30
    chained = sum(1 for a, b in itertools.pairwise(done) if b.started_at == a.finished_at)
    assert chained == 29
    assert all(_gapless(job) and job.lease_epoch == 1 for job in done)
    kinds = JobEvent.objects.filter(kind__in=["started", "completed"]).values_list("kind")
    assert kinds.count() == 60


@pytest.mark.slow
@pytest.mark.parametrize("concurrency", ["1", "3"])
def test_max_jobs_is_exact(workers, concurrency):
    """--max-jobs 7 runs exactly seven jobs, follow-on claims included, and leaves the
    rest queued and unleased."""
    jobs.enqueue_many("durable.noop", [{"units": 1}] * 20)
    proc = workers.start("--max-jobs", "7", "--concurrency", concurrency)
    proc.wait(timeout=60)
    assert proc.returncode == 0, workers.log(proc)
    states = list(Job.objects.values_list("state", "lease_owner"))
    assert states.count(("completed", None)) == 7, states
    assert states.count(("queued", None)) == 13, states
    assert JobEvent.objects.filter(kind="started").count() == 7


@pytest.mark.slow
@pytest.mark.parametrize("concurrency", ["1", "4"])
def test_sigterm_leaves_nothing_leased_and_every_event_log_gapless(workers, concurrency):
    """A worker draining one-unit jobs, each finish claiming the next, is stopped with
    SIGTERM: every job ends completed or queued (a job claimed as the stop arrived is
    handed back, no attempt spent), none leased, each job's events without a gap."""
    jobs.enqueue_many("durable.noop", [{"units": 1, "sleep": 0.002}] * 3000)
    proc = workers.start("--concurrency", concurrency)
    wait_until(lambda: Job.objects.filter(state="completed").count() >= 200, timeout=60)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert proc.returncode == 0, workers.log(proc)
    time.sleep(0.1)
    assert not Job.objects.exclude(state__in=["completed", "queued"]).exists()
    assert not Job.objects.exclude(lease_owner=None).exists()
    assert Job.objects.filter(state="queued").exists(), "the worker drained everything"
    assert not Job.objects.filter(state="queued", attempts__gt=0).exists()
    for job in Job.objects.exclude(event_seq=1):
        assert _gapless(job), job.pk
        kinds = list(job.events.order_by("seq").values_list("kind", flat=True))
        assert kinds[-1] in ("completed", "released"), kinds


def test_worker_execute_without_follow_claims_nothing():
    """``Worker.execute`` (tests, run_job) finishes a job alone."""
    jobs.enqueue("durable.noop", {"units": 1})
    waiting = jobs.enqueue("durable.noop", {"units": 1})
    worker = Worker(worker_id="w", burst=True, lease_seconds=30)
    claimed = claim("w", queues=["default"], operations=sorted(registered()), lease_seconds=30)
    assert claimed is not None
    worker.execute(*claimed)
    waiting.refresh_from_db()
    assert waiting.state == "queued"


def test_an_error_after_the_finishing_commit_hands_the_follow_on_back():
    """The last unit's commit claimed the thread's next job, then an exception escaped
    the runner (the units iterable's close() raised): the next job goes back to the
    queue at once (queued, no lease, no attempt spent, nothing held), instead of
    staying leased and renewed by a thread that will never run it."""
    first = jobs.enqueue("test.close_raises", {"units": 1})
    following = jobs.enqueue("durable.noop", {"units": 1})
    worker = Worker(worker_id="w", burst=True, lease_seconds=30)
    claimed = claim("w", queues=["default"], operations=sorted(registered()), lease_seconds=30)
    assert claimed is not None
    assert claimed[1].pk == first.pk
    then = NextClaim("w", ["default"], sorted(registered()), 30)
    with pytest.raises(RuntimeError, match="close"):
        worker.runner.execute(*claimed, follow=lambda: then)
    first.refresh_from_db()
    following.refresh_from_db()
    assert first.state == "completed"
    assert (following.state, following.lease_owner, following.attempts) == ("queued", None, 0)
    assert list(following.events.values_list("kind", flat=True)) == [
        "enqueued",
        "started",
        "released",
    ]
    assert _gapless(following)
    assert worker.executions.held() == set()  # neither job is renewed any more
