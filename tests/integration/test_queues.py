"""Paused queues (durable.queues): workers do not claim from them; nothing else changes.
And how a worker ended (WorkerProcess.exit_reason)."""

from __future__ import annotations

import signal

import pytest
from django.db import connection

from durable import jobs, lease, rescue
from durable.errors import InputRejected
from durable.models import Job, PausedQueue, WorkerProcess
from durable.queues import pause_queue, paused_queues, resume_queue
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db

OPS = ["test.rows"]


def claim(queues: list[str]) -> Job | None:
    taken = lease.claim("w", queues=queues, operations=OPS, lease_seconds=30)
    return taken[1] if taken else None


def test_a_paused_queue_is_not_claimed_from_until_resumed():
    held = jobs.enqueue("test.rows", {}, queue="mail", priority=50)
    other = jobs.enqueue("test.rows", {}, queue="default")
    assert pause_queue("mail", actor="alice", reason="provider down") is True
    assert pause_queue("mail", actor="bob") is False  # already so: nothing changes
    assert paused_queues()["mail"].paused_by == "alice"
    # the higher-priority job of the paused queue is skipped, the other queue goes on
    assert claim(["mail", "default"]).pk == other.pk
    assert claim(["mail", "default"]) is None
    assert Job.objects.get(pk=held.pk).state == "queued"  # kept, untouched
    jobs.enqueue("test.rows", {}, queue="mail")  # still accepts new jobs
    assert resume_queue("mail") is True
    assert resume_queue("mail") is False
    assert claim(["mail"]).pk == held.pk


def test_pick_sql__one_extra_condition_not_an_extra_query():
    sql, _ = lease.pick_sql(None, queues=["default"], operations=OPS)
    assert f"FROM {connection.ops.quote_name(PausedQueue._meta.db_table)}" in sql
    assert sql.count("SELECT") == 2  # the pick and its paused-queue condition


@pytest.mark.parametrize(
    "name",
    [
        "",
        "q" * 65,  # wider than Job.queue
        "a b",  # the API refuses it: no job can be in it
        "-leading",
        "ünïcode",
    ],
)
def test_pause_queue__refuses_a_name_no_job_can_have(name):
    with pytest.raises(ValueError, match="1 to 64 letters, digits"):
        pause_queue(name)
    assert not PausedQueue.objects.exists()


@pytest.mark.parametrize("name", ["q" * 65, "a b", "-leading", "ünïcode"])
def test_enqueue__refuses_the_queue_names_pausing_refuses(name):
    with pytest.raises(InputRejected, match="1 to 64 letters, digits") as refused:
        jobs.enqueue("test.rows", {}, queue=name)
    assert refused.value.field == "queue"
    assert not Job.objects.exists()


def test_exit_reason__clean_stop_and_lost_worker_and_exit_70_is_kept():
    for worker_id in ("clean", "lost", "hung"):
        rescue.register_inline(worker_id, lease_seconds=1)
    rescue.mark_stopped("clean")
    rescue.record_exit_reason("hung", WorkerProcess.EXIT_UNIT_TIMEOUT)
    for worker in WorkerProcess.objects.filter(worker_id__in=["lost", "hung"]):
        rescue._mark_lost(worker)
    reasons = dict(WorkerProcess.objects.values_list("worker_id", "exit_reason"))
    assert reasons == {"clean": "clean", "lost": "lost", "hung": "unit-timeout"}
    assert not WorkerProcess.objects.filter(stopped_at__isnull=True).exists()


@pytest.mark.django_db(transaction=True)
def test_exit_reason__a_killed_worker_is_recorded_lost_by_its_peer(workers):
    job = jobs.enqueue("durable.noop", {"units": 200, "sleep": 0.05})
    victim = workers.start("--operation", "durable.noop", lease=1.0)
    wait_until(lambda: Job.objects.filter(pk=job.pk, state="running").exists())
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    peer = workers.start("--operation", "durable.noop", lease=1.0)
    wait_until(lambda: WorkerProcess.objects.filter(pid=victim.pid, exit_reason="lost").exists())
    peer.send_signal(signal.SIGTERM)
    assert peer.wait(timeout=15) == 0, workers.log(peer)
    assert WorkerProcess.objects.get(pid=peer.pid).exit_reason == "clean"
