"""Issue 12: small jobs at full speed — statement counts, bulk enqueue, wake-ups.

Statement counts are part of the contract: each test here counts the queries
of one step and fails when one more appears.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from durable import jobs
from durable.errors import InputRejected, LeaseLost
from durable.lease import claim, claim_many, finish_unit
from durable.models import Job, JobEvent, PausedQueue, UnitResult
from durable.operations import registered
from durable.worker import Worker
from tests.conftest import wait_until
from tests.testapp.models import SideEffect

from .helpers import drain

pytestmark = pytest.mark.django_db


def _writes(captured: CaptureQueriesContext) -> list[str]:
    """The statements that reached the database, without transaction brackets."""
    skip = ("SAVEPOINT", "RELEASE SAVEPOINT", "BEGIN", "COMMIT", "ROLLBACK")
    return [q["sql"] for q in captured.captured_queries if not q["sql"].startswith(skip)]


# --- enqueue ------------------------------------------------------------------------


def test_enqueue__writes_the_job_and_its_first_event_in_one_statement_two_on_sqlite():
    with CaptureQueriesContext(connection) as captured:
        job = jobs.enqueue("durable.noop", {"units": 1})
    statements = _writes(captured)
    if connection.vendor == "postgresql":
        assert len(statements) == 1, statements
        assert 'INSERT INTO "durable_job"' in statements[0]
        assert 'INSERT INTO "durable_jobevent"' in statements[0]
    else:
        assert len(statements) == 2, statements
        assert statements[0].startswith('INSERT INTO "durable_job"')
        assert statements[1].startswith('INSERT INTO "durable_jobevent"')
    assert job.pk == Job.objects.get().pk
    job.refresh_from_db()
    assert job.event_seq == 1
    assert list(job.events.values_list("seq", "kind")) == [(1, "enqueued")]


# --- enqueue outside any transaction: its own, on the driver's cursor (issue 23) ----------

# Values whose JSON text a careless encoder would change: a float beyond any integer,
# negative zero, the smallest normal-ish float, and text that is not ASCII.
AWKWARD_INPUT = {
    "units": 1,
    "big": 1e100,
    "negative_zero": -0.0,
    "tiny": 1e-300,
    "text": "Zürich ☃ 日本 — \u00e9\U0001f600",
    "nested": {"list": [1.5, -0.0, 1e100, "ü"], "empty": {}},
}
ENQUEUE_OPTIONS = {
    "owner": "alice",
    "tenant": "t1",
    "queue": "bulk",
    "priority": 7,
    "on_restart": "retry",
    "max_attempts": 3,
}


def _columns(job_id: int) -> dict:
    """A job's stored columns, read back; those that differ between two enqueues by
    nature (id, the moment, the unique key) left out, the input as canonical JSON
    text so that -0.0 against 0.0 or 1e100 against an integer shows."""
    row = Job.objects.filter(pk=job_id).values().get()
    for name in ("id", "created_at", "updated_at", "unique_key"):
        row.pop(name)
    row["input"] = json.dumps(row["input"], sort_keys=True)
    events = JobEvent.objects.filter(job_id=job_id).values_list("seq", "kind", "message", "data")
    row["events"] = list(events)
    return row


@pytest.mark.django_db(transaction=True)
def test_enqueue_alone__one_statement_its_own_transaction_on_postgresql_one_turn_on_sqlite():
    """Outside any transaction enqueue() needs no COMMIT round trip on PostgreSQL (one
    autocommit statement, the job and its event) and on SQLite BEGIN IMMEDIATE, the
    two INSERTs and COMMIT. One more statement fails this test."""
    jobs.enqueue("durable.noop", {"units": 1})  # the first call adapts the defaults
    with driver_log() as log:
        job = jobs.enqueue("durable.noop", {"units": 1})
    if connection.vendor == "postgresql":
        assert summary(log) == (1, 1), log
        assert [kind for kind, _ in log] == ["autocommit"], log
    else:
        assert summary(log) == (2, 1), log
        assert log[0][1] == "BEGIN IMMEDIATE", log
    assert job.created
    assert Job.objects.get(pk=job.pk).event_seq == 1
    assert list(JobEvent.objects.filter(job_id=job.pk).values_list("seq", "kind", "data")) == [
        (1, "enqueued", {"owner": "", "queue": "default"})
    ]


@pytest.mark.django_db(transaction=True)
def test_enqueue_alone__stores_what_the_orm_path_and_enqueue_many_store():
    run_after = timezone.now() + timedelta(hours=1)
    options = {**ENQUEUE_OPTIONS, "run_after": run_after}
    alone = jobs.enqueue("test.rows", AWKWARD_INPUT, unique_key="a", **options)
    with transaction.atomic():  # inside the caller's transaction: the ORM path
        joined = jobs.enqueue("test.rows", AWKWARD_INPUT, unique_key="b", **options)
    [bulk] = jobs.enqueue_many("test.rows", [AWKWARD_INPUT], unique_keys=["c"], **options)
    # The same model values came back from each path, too.
    assert alone.input == joined.input == bulk.input == AWKWARD_INPUT
    assert (alone.operation, alone.queue, alone.on_restart) == ("test.rows", "bulk", "retry")
    stored = _columns(alone.pk)
    assert stored == _columns(joined.pk)
    assert stored == _columns(bulk.pk)
    assert json.loads(stored["input"])["text"] == AWKWARD_INPUT["text"]
    assert json.dumps(Job.objects.get(pk=alone.pk).input["negative_zero"]) == json.dumps(
        Job.objects.get(pk=joined.pk).input["negative_zero"]
    )
    assert stored["next_attempt_at"] == run_after
    assert (stored["owner"], stored["tenant"], stored["priority"]) == ("alice", "t1", 7)
    assert (stored["max_attempts"], stored["state"], stored["errors"]) == (3, "queued", [])
    assert stored["events"] == [(1, "enqueued", "", {"owner": "alice", "queue": "bulk"})]
    assert alone.errors is not joined.errors  # each job its own list


@pytest.mark.django_db(transaction=True)
def test_enqueue_alone__a_taken_unique_key_returns_the_unfinished_job_as_the_orm_path_does():
    first = jobs.enqueue("test.one_per_target", {"target": "a"})
    again = jobs.enqueue("test.one_per_target", {"target": "a"})
    with transaction.atomic():
        joined = jobs.enqueue("test.one_per_target", {"target": "a"})
    assert (first.created, again.created, joined.created) == (True, False, False)
    assert first.pk == again.pk == joined.pk
    assert Job.objects.count() == 1
    assert JobEvent.objects.count() == 1
    # Once the job is finished the key is free again: a new job, on either path.
    Job.objects.filter(pk=first.pk).update(state="completed")
    fresh = jobs.enqueue("test.one_per_target", {"target": "a"})
    assert fresh.created
    assert fresh.pk != first.pk
    # The path alone looks nothing up first: a taken key is the partial unique index
    # refusing the INSERT, then the lookup of the unfinished job — an explicit key too.
    explicit = jobs.enqueue("test.rows", {"units": 1}, unique_key="k")
    assert jobs.enqueue("test.rows", {"units": 2}, unique_key="k").pk == explicit.pk
    # Invalid input raises before anything is written, as before.
    with pytest.raises(InputRejected):
        jobs.enqueue("test.rows", {"units": 1}, unique_key="")
    assert Job.objects.count() == 3


@pytest.mark.django_db(transaction=True)
def test_enqueue_alone__the_signal_fires_once_after_the_commit():
    from durable import signals

    seen: list[tuple[int, str, bool]] = []

    def receiver(sender, job_id, kind, **kwargs):
        # Committed: another connection (a fresh one in this thread) sees the row.
        visible = _visible_elsewhere(job_id)
        seen.append((job_id, kind, visible))

    signals.job_state_changed.connect(receiver, dispatch_uid="test.enqueue_alone")
    try:
        job = jobs.enqueue("durable.noop", {"units": 1})
        assert seen == [(job.pk, "enqueued", True)]
        with transaction.atomic():
            inner = jobs.enqueue("durable.noop", {"units": 1})
            assert len(seen) == 1, "sent before the caller's transaction committed"
        assert seen[1:] == [(inner.pk, "enqueued", True)]
    finally:
        signals.job_state_changed.disconnect(dispatch_uid="test.enqueue_alone")


def _visible_elsewhere(job_id: int) -> bool:
    """Whether a second connection to the same database sees job ``job_id``."""
    from django.db import connections

    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute('SELECT count(*) FROM "durable_job" WHERE id = %s', [job_id])
            return cursor.fetchone()[0] == 1
    finally:
        other.close()


@pytest.mark.django_db(transaction=True)
def test_enqueue_alone__inside_a_transaction_it_joins_it_and_rolls_back_with_it():
    def enqueue_then_fail() -> None:
        with transaction.atomic():
            jobs.enqueue("durable.noop", {"units": 1})
            raise RuntimeError("the caller changed its mind")

    with pytest.raises(RuntimeError):
        enqueue_then_fail()
    assert not Job.objects.exists()
    assert not JobEvent.objects.exists()


def test_enqueue_many__writes_every_job_and_event_in_order_in_a_few_statements():
    inputs = [{"units": n} for n in range(1, 1201)]
    with CaptureQueriesContext(connection) as captured:
        created = jobs.enqueue_many("durable.noop", inputs, owner="bulk", priority=3)
    assert len(_writes(captured)) <= 2, "one batch of 1,200: two statements at most"
    assert [job.input["units"] for job in created] == list(range(1, 1201))
    assert all(job.created for job in created)
    stored = dict(Job.objects.filter(owner="bulk").values_list("pk", "input"))
    assert len(stored) == 1200
    for job in created:  # each returned pk is the row holding that input
        assert stored[job.pk] == job.input
    assert set(Job.objects.values_list("priority", "state", "event_seq", "queue")) == {
        (3, "queued", 1, "default")
    }
    events = JobEvent.objects.filter(job__owner="bulk")
    assert events.count() == 1200
    assert set(events.values_list("seq", "kind")) == {(1, "enqueued")}
    assert events.first().data == {"owner": "bulk", "queue": "default"}
    job = Job.objects.get(pk=created[7].pk)
    assert job.input == {"units": 8, "sleep": 0}  # cleaned by the operation


def test_enqueue_many__batches_share_one_transaction():
    created = jobs.enqueue_many("durable.noop", [{"units": 1}] * 25, batch_size=10)
    assert len({job.pk for job in created}) == 25
    assert Job.objects.count() == 25


def test_enqueue_many__one_bad_input_writes_nothing_and_says_which():
    inputs = [{"units": 1}, {"units": 2}, {"units": "many"}, {"units": 4}]
    with pytest.raises(InputRejected) as info:
        jobs.enqueue_many("durable.noop", inputs)
    assert info.value.field == "inputs[2].units"
    with pytest.raises(InputRejected) as info:
        jobs.enqueue_many("durable.noop", [{"units": 1}, {"units": 1, "api_key": "abcd1234"}])
    assert info.value.field == "inputs[1].api_key"
    assert not Job.objects.exists()
    assert not JobEvent.objects.exists()


def test_enqueue_many__honours_unique_keys_against_the_table_and_within_the_call():
    first = jobs.enqueue("test.one_per_target", {"target": "a"})
    created = jobs.enqueue_many(
        "test.one_per_target",
        [{"target": "a"}, {"target": "b"}, {"target": "b"}, {"target": "c"}],
    )
    assert [(job.unique_key, job.created) for job in created] == [
        ("target:a", False),
        ("target:b", True),
        ("target:b", False),
        ("target:c", True),
    ]
    assert created[0].pk == first.pk
    assert created[1].pk == created[2].pk
    assert Job.objects.count() == 3
    explicit = jobs.enqueue_many(
        "test.rows", [{"units": 1}, {"units": 1}], unique_keys=["k1", None]
    )
    assert explicit[0].unique_key == "k1"
    assert explicit[1].unique_key is None
    again = jobs.enqueue_many("test.rows", [{"units": 1}], unique_keys=["k1"])
    assert (again[0].pk, again[0].created) == (explicit[0].pk, False)
    with pytest.raises(InputRejected, match="unique_keys"):
        jobs.enqueue_many("test.rows", [{"units": 1}], unique_keys=["a", "b"])


def test_enqueue_many__rolls_back_with_the_callers_transaction():
    def enqueue_then_fail() -> None:
        with transaction.atomic():
            jobs.enqueue_many("durable.noop", [{"units": 1}] * 5)
            raise RuntimeError("the caller changed its mind")

    with pytest.raises(RuntimeError):
        enqueue_then_fail()
    assert not Job.objects.exists()


def test_enqueue_many__jobs_run_like_any_other():
    created = jobs.enqueue_many("test.rows", [{"units": 2}] * 3)
    for job in created:
        finished = drain(job.pk)
        assert finished.state == "completed"
        assert list(finished.events.values_list("seq", flat=True)) == list(
            range(1, finished.event_seq + 1)
        )


def test_enqueue_job_command__inputs_file_enqueues_every_line_or_none(tmp_path, capsys):
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join(json.dumps({"units": n}) for n in range(1, 6)) + "\n\n")
    call_command("enqueue_job", "durable.noop", "--inputs", str(path))
    assert "enqueued 5 durable.noop job(s)" in capsys.readouterr().out
    assert sorted(j["units"] for j in Job.objects.values_list("input", flat=True)) == [
        1, 2, 3, 4, 5,
    ]  # fmt: skip
    path.write_text('{"units": 1}\n{"units": "x"}\n')
    with pytest.raises(CommandError, match=r"inputs\[1\]\.units"):
        call_command("enqueue_job", "durable.noop", "--inputs", str(path))
    path.write_text('{"units": 1}\nnot json\n')
    with pytest.raises(CommandError, match="line 2 is not JSON"):
        call_command("enqueue_job", "durable.noop", "--inputs", str(path))
    assert Job.objects.count() == 5


# --- wake-ups -------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_wakeup__a_job_enqueued_into_an_idle_worker_starts_long_before_its_poll(workers):
    """PostgreSQL: NOTIFY from the enqueue's transaction; SQLite: PRAGMA data_version."""
    proc = workers.start("--poll-interval", "60")
    first = jobs.enqueue("durable.noop", {"units": 1})
    # Start-up claims at once; then the worker is idle, its next poll a minute away.
    wait_until(lambda: Job.objects.get(pk=first.pk).state == "completed", timeout=30)
    for pause in (0.3, 1.0):
        time.sleep(pause)
        job = jobs.enqueue("durable.noop", {"units": 1})
        wait_until(lambda j=job: Job.objects.get(pk=j.pk).state == "completed", timeout=10)
        job.refresh_from_db()
        waited = (job.started_at - job.created_at).total_seconds()
        assert waited < 2.0, (waited, workers.log(proc))
    later = jobs.enqueue(
        "durable.noop", {"units": 1}, run_after=timezone.now() + timedelta(hours=1)
    )
    time.sleep(0.3)
    assert Job.objects.get(pk=later.pk).state == "queued"  # woken, but not due: not taken
    assert proc.poll() is None, workers.log(proc)


# --- two commits per one-unit job -------------------------------------------------------


@contextmanager
def driver_log() -> Iterator[list[tuple[str, str]]]:
    """Every statement the driver sends, however issued (Django's cursor or the DB-API's).

    Entries are ("sql", text) for a statement and ("commit", "") for an explicit
    commit. SQLite: the connection's trace callback (BEGIN and COMMIT included).
    PostgreSQL: psycopg's Cursor.execute and Connection.commit; a statement run
    in autocommit mode is its own transaction.
    """
    log: list[tuple[str, str]] = []
    connection.ensure_connection()
    if connection.vendor == "sqlite":
        connection.connection.set_trace_callback(lambda sql: log.append(("sql", sql)))
        try:
            yield log
        finally:
            connection.connection.set_trace_callback(None)
        return
    import psycopg

    execute, commit = psycopg.Cursor.execute, psycopg.Connection.commit

    def traced_execute(self, query, *args, **kwargs):
        text = query if isinstance(query, str) else str(query)
        kind = "sql" if not self.connection.autocommit else "autocommit"
        log.append((kind, text))
        return execute(self, query, *args, **kwargs)

    def traced_commit(self):
        log.append(("commit", ""))
        return commit(self)

    psycopg.Cursor.execute, psycopg.Connection.commit = traced_execute, traced_commit
    try:
        yield log
    finally:
        psycopg.Cursor.execute, psycopg.Connection.commit = execute, commit


def summary(log: list[tuple[str, str]]) -> tuple[int, int]:
    """(statements other than BEGIN/COMMIT/ROLLBACK, transactions)."""
    brackets = ("BEGIN", "COMMIT", "ROLLBACK")
    statements = [t for k, t in log if k != "commit" and not t.strip().upper().startswith(brackets)]
    transactions = sum(1 for k, t in log if k == "autocommit" or t.strip().upper() == "COMMIT")
    transactions += sum(1 for k, _ in log if k == "commit")
    return len(statements), transactions


@pytest.mark.django_db(transaction=True)
def test_statements__claiming_and_finishing_a_one_unit_job():
    """PostgreSQL: one statement each, its own transaction. SQLite: two transactions,
    the claim (UPDATE … RETURNING, started event) and the finish (checkpoint and
    state, unit result, completed event). One more statement fails this test."""
    job = jobs.enqueue("durable.noop", {"units": 1})
    worker = Worker(worker_id="counting", burst=True, lease_seconds=30)
    ops = sorted(registered())
    with driver_log() as claiming:
        claimed = claim("counting", queues=["default"], operations=ops, lease_seconds=30)
    assert claimed is not None
    with driver_log() as finishing:
        worker.execute(*claimed)
    if connection.vendor == "postgresql":
        assert summary(claiming) == (1, 1), claiming
        assert summary(finishing) == (1, 1), finishing
    else:
        assert summary(claiming) == (2, 1), claiming
        assert summary(finishing) == (3, 1), finishing
    job.refresh_from_db()
    assert (job.state, job.units_done, job.lease_owner, job.checkpoint) == (
        "completed", 1, None, {"next": 1},
    )  # fmt: skip
    assert list(job.events.values_list("seq", "kind", "data")) == [
        (1, "enqueued", {"owner": "", "queue": "default"}),
        (2, "started", {"worker": "counting", "epoch": 1, "attempt": 1}),
        (3, "completed", {"units_done": 1}),
    ]
    assert list(UnitResult.objects.filter(job=job).values_list("key", flat=True)) == ["n:0"]
    assert job.finished_at is not None
    assert job.started_at is not None


@pytest.mark.django_db(transaction=True)
def test_statements__an_empty_claim_is_one_statement():
    with driver_log() as log:
        assert claim("w", queues=["default"], operations=["durable.noop"], lease_seconds=30) is None
    expected = 1  # PostgreSQL: the claim statement; SQLite: the UPDATE (BEGIN/COMMIT aside)
    assert summary(log)[0] == expected, log


# --- one claim for the threads that want a job at the same moment -------------------------


def test_claim_many__due_jobs_in_priority_order_each_as_if_claimed_alone():
    low = jobs.enqueue("durable.noop", {"units": 1}, priority=0)
    high = jobs.enqueue("durable.noop", {"units": 1}, priority=5)
    middle = jobs.enqueue("durable.noop", {"units": 1}, priority=2)
    later = jobs.enqueue("durable.noop", {}, run_after=timezone.now() + timedelta(hours=1))
    paused = jobs.enqueue("durable.noop", {"units": 1}, queue="mail")
    PausedQueue.objects.create(queue="mail")
    claimed = claim_many(
        "group", 10, queues=["default", "mail"], operations=["durable.noop"], lease_seconds=30
    )
    assert [job.pk for _, job in claimed] == [high.pk, middle.pk, low.pk]
    for lease_, job in claimed:
        assert (lease_.job_id, lease_.owner, lease_.epoch) == (job.pk, "group", 1)
        assert job.has_results is False
        job.refresh_from_db()
        assert (job.state, job.lease_owner, job.lease_epoch) == ("running", "group", 1)
        assert list(job.events.values_list("seq", "kind", "data")) == [
            (1, "enqueued", {"owner": "", "queue": "default"}),
            (2, "started", {"worker": "group", "epoch": 1, "attempt": 1}),
        ]
    assert Job.objects.get(pk=later.pk).state == "queued"  # not due
    assert Job.objects.get(pk=paused.pk).state == "queued"  # its queue is paused
    assert claim_many("group", 3, queues=["default"], operations=["durable.noop"],
                      lease_seconds=30) == []  # fmt: skip


def test_claim_many__several_queues_merge_into_one_order():
    """PostgreSQL picks each queue on its own (durable_job_due is read in order per
    queue); the merged claim is still the global order, and a queue named twice
    claims nothing twice."""
    earlier = timezone.now() - timedelta(minutes=5)
    mail_high = jobs.enqueue("durable.noop", {"units": 1}, queue="mail", priority=9)
    default_old = jobs.enqueue("durable.noop", {"units": 1}, priority=3, run_after=earlier)
    mail_new = jobs.enqueue("durable.noop", {"units": 1}, queue="mail", priority=3)
    default_low = jobs.enqueue("durable.noop", {"units": 1}, priority=1)
    jobs.enqueue("durable.noop", {"units": 1}, queue="other", priority=99)  # not asked for
    queues = ["default", "mail", "default"]
    first = claim_many("m", 3, queues=queues, operations=["durable.noop"], lease_seconds=30)
    assert [job.pk for _, job in first] == [mail_high.pk, default_old.pk, mail_new.pk]
    rest = claim_many("m", 3, queues=queues, operations=["durable.noop"], lease_seconds=30)
    assert [job.pk for _, job in rest] == [default_low.pk]
    assert Job.objects.filter(state="running").count() == 4
    assert Job.objects.get(queue="other").state == "queued"


@pytest.mark.django_db(transaction=True)
def test_statements__a_claim_for_three_threads_is_the_statements_of_a_claim_for_one():
    for _ in range(4):
        jobs.enqueue("durable.noop", {"units": 1})
    with driver_log() as claiming:
        claimed = claim_many(
            "group", 3, queues=["default"], operations=["durable.noop"], lease_seconds=30
        )
    assert len(claimed) == 3
    expected = (1, 1) if connection.vendor == "postgresql" else (2, 1)
    assert summary(claiming) == expected, claiming
    assert JobEvent.objects.filter(kind="started").count() == 3
    assert Job.objects.filter(state="queued").count() == 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_claim_desk__a_deep_queue_costs_one_commit_per_job_and_every_job_runs_once(workers):
    """A real worker with 4 threads drains 300 one-unit jobs in about one commit per job:
    each thread's first claim at the desk, then every finish claims its thread's next
    job in the same transaction (issue 23; before it, the desk's group claims made
    fewer claim commits than jobs, but a claim and a finish per job remained). A
    commit's moment stamps what it wrote (``started_at``, ``finished_at``), so the
    distinct moments count the commits. Every job started once and completed once,
    its events numbered without a gap."""
    jobs.enqueue_many("durable.noop", [{"units": 1}] * 300)
    proc = workers.run("--concurrency", "4", timeout=120)
    assert proc.returncode == 0, workers.log(proc)
    assert set(Job.objects.values_list("state", flat=True)) == {"completed"}
    kinds = Counter(JobEvent.objects.values_list("kind", flat=True))
    assert (kinds["started"], kinds["completed"], kinds["enqueued"]) == (300, 300, 300)
    assert Job.objects.filter(event_seq=3, units_done=1, lease_epoch=1).count() == 300
    moments = set(Job.objects.values_list("started_at", flat=True))
    moments |= set(Job.objects.values_list("finished_at", flat=True))
    assert len(moments) <= 300 + 4, "more than one commit per job"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_claim_desk__no_job_is_leased_ahead_of_a_thread_free_to_start_it(workers):
    """Two threads, a deep queue of jobs that each take a while: at no moment does the
    worker hold more than two jobs, so no lease covers a job that is not started."""
    jobs.enqueue_many("durable.noop", [{"units": 1, "sleep": 0.15}] * 12)
    proc = workers.start("--concurrency", "2")
    held = []
    deadline = time.monotonic() + 60
    while Job.objects.exclude(state="completed").exists():
        assert time.monotonic() < deadline, workers.log(proc)
        held.append(Job.objects.filter(state="running").count())
        time.sleep(0.01)
    assert max(held) == 2, held  # both threads busy, and never more than they can start
    assert proc.poll() is None, workers.log(proc)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_claim_desk__a_worker_killed_holding_a_group_loses_nothing(workers, tmp_path):
    """SIGKILL right after a claim, with the other threads holding jobs of their own:
    a restarted worker finishes every job, each unit recorded once, events gapless."""
    out = tmp_path / "side-effects.log"
    for _ in range(40):
        jobs.enqueue("test.append", {"units": 2, "path": str(out)})
    crashed = workers.run("--concurrency", "4", faults="after_claim:25")
    assert crashed.returncode == -signal.SIGKILL, workers.log(crashed)
    assert Job.objects.filter(state="running").exists()  # leases the death left behind
    # Jobs taken back after a restart come due gradually: a worker that stays, not --burst.
    restarted = workers.start("--concurrency", "4")
    wait_until(lambda: not Job.objects.exclude(state="completed").exists(), timeout=90)
    assert restarted.poll() is None, workers.log(restarted)
    for job in Job.objects.all():
        assert job.state == "completed", (job.pk, job.state)
        assert_finished_once(job)


def test_finish__a_cancel_during_the_last_unit_wins_over_completion():
    job = drain(jobs.enqueue("test.act", {"units": 2, "act_at": 1, "action": "cancel"}).pk)
    assert (job.state, job.units_done, job.lease_owner) == ("cancelled", 2, None)
    assert (job.error_code, job.reason) == ("cancelled", "cancelled")  # as complete() sets it
    events = list(job.events.values_list("seq", "kind"))
    assert [kind for _, kind in events][-2:] == ["cancel_requested", "cancelled"]
    assert [seq for seq, _ in events] == list(range(1, job.event_seq + 1))
    assert SideEffect.objects.filter(job_id=job.pk).count() == 2
    assert UnitResult.objects.filter(job=job).count() == 2


def test_finish__a_lost_lease_writes_nothing(monkeypatch):
    job = jobs.enqueue("durable.noop", {"units": 1})
    lease_, _ = claim("old", queues=["default"], operations=["durable.noop"], lease_seconds=30)
    Job.objects.filter(pk=job.pk).update(lease_epoch=F("lease_epoch") + 1)  # taken back
    with pytest.raises(LeaseLost):
        finish_unit(
            lease_, key="n:0", result=None, checkpoint={"next": 1}, units_total=1,
            operation="durable.noop", attempts=0,
        )  # fmt: skip
    job.refresh_from_db()
    assert (job.state, job.units_done, job.checkpoint) == ("running", 0, None)
    assert not UnitResult.objects.filter(job=job).exists()
    assert list(job.events.values_list("kind", flat=True)) == ["enqueued", "started"]


def test_finish__an_estimated_total_that_was_too_low_runs_the_extra_unit():
    job = jobs.enqueue("test.append", {"units": 3, "path": "/dev/null"})
    Job.objects.filter(pk=job.pk).update(units_total=1)  # the estimate says one unit
    job = drain(job.pk)
    assert (job.state, job.units_done) == ("completed", 3)
    assert list(job.events.values_list("kind", flat=True)).count("completed") == 1


# --- crashes inside the merged "last unit + complete" transaction ------------------------


def done_lines(path) -> Counter:
    if not path.exists():
        return Counter()
    return Counter(line.split()[2] for line in path.read_text().splitlines() if line[:5] == "done ")


def assert_finished_once(job: Job) -> None:
    kinds = list(job.events.order_by("seq").values_list("kind", flat=True))
    assert kinds.count("completed") == 1, kinds
    assert list(job.events.order_by("seq").values_list("seq", flat=True)) == list(
        range(1, job.event_seq + 1)
    )
    keys = Counter(UnitResult.objects.filter(job=job).values_list("key", flat=True))
    assert keys == {f"u{i}": 1 for i in range(job.units_total)}
    assert job.units_done == job.units_total


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("idempotent", [False, True])
def test_crash_inside_the_finishing_transaction__the_last_unit_is_not_lost(
    workers, tmp_path, idempotent
):
    """SIGKILL with the merged commit's writes made but not committed (SQLite; on
    PostgreSQL just before its one statement): nothing of it is kept, the unit runs
    again (once more unless it checks its own evidence) and the job completes once."""
    out = tmp_path / "side-effects.log"
    job = jobs.enqueue("test.append", {"units": 3, "path": str(out), "idempotent": idempotent})
    crashed = workers.run(faults="finish_before_commit:1")
    assert crashed.returncode == -signal.SIGKILL, workers.log(crashed)
    job.refresh_from_db()
    assert (job.state, job.checkpoint, job.units_done) == ("running", {"next": 2}, 2)
    assert not UnitResult.objects.filter(job=job, key="u2").exists()
    assert "completed" not in job.events.values_list("kind", flat=True)

    restarted = workers.run()
    assert restarted.returncode == 0, workers.log(restarted)
    job.refresh_from_db()
    assert job.state == "completed"
    assert job.reclaims == 1
    assert_finished_once(job)
    assert done_lines(out) == {"u0": 1, "u1": 1, "u2": 1 if idempotent else 2}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_crash_after_the_finishing_commit__the_job_is_completed_once(workers, tmp_path):
    out = tmp_path / "side-effects.log"
    job = jobs.enqueue("test.append", {"units": 3, "path": str(out)})
    crashed = workers.run(faults="finish_after_commit:1")
    assert crashed.returncode == -signal.SIGKILL, workers.log(crashed)
    job.refresh_from_db()
    assert (job.state, job.lease_owner) == ("completed", None)

    restarted = workers.run()
    assert restarted.returncode == 0, workers.log(restarted)
    job.refresh_from_db()
    assert job.state == "completed"
    assert job.reclaims == 0  # nothing to take back: the lease went with the commit
    assert_finished_once(job)
    assert done_lines(out) == {"u0": 1, "u1": 1, "u2": 1}


# --- the claimed row as a Job, without Model.__init__ -------------------------------------


@pytest.mark.django_db(transaction=True)
def test_claim__the_job_built_from_the_row_is_the_one_the_orm_reads():
    """Every field of the claimed Job (built without ``Model.__init__``, SQLite's
    timestamps read with ``fromisoformat``) equals what the ORM reads back."""
    jobs.enqueue("durable.noop", {"units": 2, "note": "é"}, priority=3)
    claimed = claim("w", queues=["default"], operations=["durable.noop"], lease_seconds=30)
    assert claimed is not None
    _, job = claimed
    read = Job.objects.get(pk=job.pk)
    for field in Job._meta.concrete_fields:
        assert getattr(job, field.attname) == getattr(read, field.attname), field.attname
    assert job.lease_expires_at is not None
    assert job.lease_expires_at.tzinfo is not None
    assert not job._state.adding
    assert job._state.db == "default"
    job.save(update_fields=["reason"])  # an ordinary instance the ORM can write


@pytest.mark.django_db(transaction=True)
def test_claim__a_site_with_post_init_receivers_gets_the_orms_construction():
    from django.db.models.signals import post_init

    seen: list[int] = []

    def receiver(sender, instance, **kwargs):
        seen.append(id(instance))

    post_init.connect(receiver, sender=Job)
    try:
        jobs.enqueue("durable.noop", {"units": 1})
        claimed = claim("w", queues=["default"], operations=["durable.noop"], lease_seconds=30)
    finally:
        post_init.disconnect(receiver, sender=Job)
    assert claimed is not None
    assert id(claimed[1]) in seen
