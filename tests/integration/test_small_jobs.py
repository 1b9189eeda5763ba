"""Issue 12: small jobs at full speed — statement counts, bulk enqueue, wake-ups.

Statement counts are part of the contract: each test here counts the queries
of one step and fails when one more appears.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from durable import jobs
from durable.errors import InputRejected
from durable.models import Job, JobEvent
from tests.conftest import wait_until

from .helpers import drain

pytestmark = pytest.mark.django_db


def _writes(captured: CaptureQueriesContext) -> list[str]:
    """The statements that reached the database, without transaction brackets."""
    skip = ("SAVEPOINT", "RELEASE SAVEPOINT", "BEGIN", "COMMIT", "ROLLBACK")
    return [q["sql"] for q in captured.captured_queries if not q["sql"].startswith(skip)]


# --- enqueue ------------------------------------------------------------------------


def test_enqueue__is_two_statements_the_job_and_its_first_event():
    with CaptureQueriesContext(connection) as captured:
        job = jobs.enqueue("durable.noop", {"units": 1})
    statements = _writes(captured)
    assert len(statements) == 2, statements
    assert statements[0].startswith("INSERT INTO")
    assert "durable_job" in statements[0]
    assert "durable_jobevent" in statements[1]
    job.refresh_from_db()
    assert job.event_seq == 1
    assert list(job.events.values_list("seq", "kind")) == [(1, "enqueued")]


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
