"""Deliveries under real worker subprocesses: SIGKILL, SIGSTOP, restarts, four workers at once.

``transaction=True`` everywhere: the workers are other processes with their
own connections, so what the test sets up must really be committed.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

import pytest
from django.utils import timezone

from durable import credential_store, notify
from durable.mail.models import MailDelivery, MailRecipient
from durable.models import Job, JobEvent
from durable.webhooks.models import Delivery, Endpoint
from tests.conftest import wait_until

from ..servers import Reply, max_concurrency, start_gaps
from .conftest import provider_env, smtp_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LOCAL = {"allow_hosts": ["127.0.0.1"], "total_timeout": 5, "max_in_flight": 0}


@pytest.fixture
def endpoint(http_server):
    credential_store.store("hook-secret", "whsec-crash-test-secret")
    return Endpoint.objects.create(
        name="ops", url=http_server.url("/hook"), secret_ref="hook-secret"
    )


def env(**provider):
    return provider_env(webhooks={**LOCAL, **provider})


def keys(server) -> list[str]:
    return [r.header("Idempotency-Key") for r in server.requests("/hook")]


def proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0]


def test_webhook__crash_after_the_post_replays_it_with_the_same_key(workers, endpoint, http_server):
    notify.publish("job.failed", "evt-crash", {"job_id": 1})
    delivery = Delivery.objects.get()
    crashed = workers.run(faults="webhook_after_post:1", env=env())
    assert crashed.returncode == -signal.SIGKILL
    assert keys(http_server) == [delivery.idempotency_key]
    delivery.refresh_from_db()
    assert delivery.state == "pending"  # the receiver has it; our record does not yet
    assert delivery.possibly_sent  # …but the record says it may have gone out

    assert workers.run(env=env()).returncode == 0
    delivery.refresh_from_db()
    job = Job.objects.get(pk=delivery.job_id)
    assert (job.state, job.reclaims) == ("completed", 1)
    assert delivery.state == "delivered"
    assert delivery.possibly_sent  # possibly delivered twice (same Idempotency-Key)
    # The replay carries the same key: the receiver can tell it is the same delivery.
    assert keys(http_server) == [delivery.idempotency_key] * 2


def test_webhook__crash_before_the_checkpoint_does_not_post_again(workers, endpoint, http_server):
    notify.publish("job.failed", "evt-crash", {"job_id": 1})
    delivery = Delivery.objects.get()
    assert workers.run(faults="after_unit:1", env=env()).returncode == -signal.SIGKILL
    delivery.refresh_from_db()
    assert delivery.state == "delivered"  # recorded, checkpoint not yet advanced
    assert not delivery.possibly_sent  # its answer was recorded: no doubt
    assert Job.objects.get(pk=delivery.job_id).checkpoint is None
    assert workers.run(env=env()).returncode == 0
    assert Job.objects.get(pk=delivery.job_id).state == "completed"
    assert keys(http_server) == [delivery.idempotency_key]  # the record said delivered: skipped


def test_webhook__expired_lease_is_reclaimed_and_the_stale_worker_cannot_record(
    workers, endpoint, http_server
):
    notify.publish("job.failed", "evt-stale", {"job_id": 1})
    delivery = Delivery.objects.get()
    stale = workers.start("--burst", faults="webhook_after_post:1:stop", lease=1.0, env=env())
    wait_until(lambda: proc_state(stale.pid) == "T")  # stopped right after its POST
    wait_until(
        lambda: Job.objects.get(pk=delivery.job_id).lease_expires_at < timezone.now(), timeout=10
    )
    rescuer = workers.run(env=env())
    assert rescuer.returncode == 0, workers.log(rescuer)  # takes the job back and delivers
    job = Job.objects.get(pk=delivery.job_id)
    assert (job.state, job.reclaims) == ("completed", 1)
    delivered = Delivery.objects.get()
    assert (delivered.state, delivered.attempts) == ("delivered", 1)

    os.kill(stale.pid, signal.SIGCONT)
    assert stale.wait(timeout=20) == 0
    assert "lease lost" in workers.log(stale)
    after = Delivery.objects.get()
    # Fenced: the stale worker's late "delivered" record was refused, nothing changed.
    assert (after.attempts, after.updated_at) == (delivered.attempts, delivered.updated_at)
    assert keys(http_server) == [delivery.idempotency_key] * 2


def test_webhook__restart_during_backoff_keeps_the_wait(workers, endpoint, http_server):
    http_server.reply("/hook", Reply(503, {"Retry-After": "3"}), Reply(200))
    notify.publish("job.failed", "evt-backoff", {"job_id": 1})
    delivery = Delivery.objects.get()
    first = workers.start(env=env())
    wait_until(lambda: Job.objects.get(pk=delivery.job_id).attempts == 1, timeout=30)
    job = Job.objects.get(pk=delivery.job_id)
    assert job.state == "queued"
    waiting_until = job.next_attempt_at
    first.kill()  # SIGKILL while the job waits out its Retry-After
    first.wait(timeout=10)
    second = workers.start(env=env())
    wait_until(lambda: Delivery.objects.get().state == "delivered", timeout=30)
    second.send_signal(signal.SIGTERM)
    second.wait(timeout=10)
    requests = http_server.requests("/hook")
    assert len(requests) == 2  # no retry storm after the restart
    gap = requests[1].started - requests[0].started
    assert gap >= 2.9, f"the second call came {gap:.2f}s after the first; Retry-After was 3"
    assert requests[1].started >= waiting_until.timestamp() - 0.05
    job.refresh_from_db()
    assert (job.state, job.attempts) == ("completed", 1)  # the restart did not reset the count


def test_gates__four_workers_hold_max_in_flight_and_min_spacing(workers, endpoint, http_server):
    """Also the concurrent-worker test: every delivery exactly once, never two at a time."""
    http_server.reply("/hook", Reply(200, delay=1.0))  # long enough for 3 at once without K
    for n in range(8):
        notify.publish("job.failed", f"evt-{n}", {"n": n})
    limits = env(max_in_flight=2, min_spacing_ms=400, gate_retry_seconds=0.3)
    procs = [workers.start(env=limits) for _ in range(4)]
    wait_until(
        lambda: Delivery.objects.filter(state="delivered").count() == 8,
        timeout=60,
        interval=0.2,
    )
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait(timeout=15)
    requests = http_server.requests("/hook")
    assert Counter(keys(http_server)) == {d.idempotency_key: 1 for d in Delivery.objects.all()}
    assert max_concurrency(requests) == 2  # K was reached and never exceeded
    # Gate passes are >= 400 ms apart on the database clock; the request reaches the
    # server a scheduling-dependent moment later, so allow 100 ms of that.
    assert min(start_gaps(requests)) >= 0.4 - 0.1, start_gaps(requests)
    job_ids = list(Delivery.objects.values_list("job_id", flat=True))
    turned_away = JobEvent.objects.filter(job_id__in=job_ids, kind="rescheduled")
    reasons = " ".join(turned_away.values_list("message", flat=True))
    # The in-flight gate certainly turned units away (1 s requests, >= 400 ms apart,
    # K=2). Whether the spacing gate did depends on how quickly workers come back on a
    # loaded machine; the server-side gaps above are its proof.
    assert "2 of 2 in flight" in reasons
    # No attempt was spent on being turned away, and more than one worker did the work.
    assert set(Job.objects.filter(pk__in=job_ids).values_list("attempts", flat=True)) == {0}
    started_by = JobEvent.objects.filter(job_id__in=job_ids, kind="started")
    assert len({e.data["worker"] for e in started_by}) >= 2


# --- mail -----------------------------------------------------------------------------------


@pytest.fixture
def recipient(smtp_server):
    return MailRecipient.objects.create(name="oncall", email="oncall@example.com")


def test_mail__crash_after_send_is_reported_as_possibly_sent_twice(workers, recipient, smtp_server):
    notify.publish("job.failed", "evt-mail", {"job_id": 1}, summary="job 1 failed")
    mail = MailDelivery.objects.get()
    crashed = workers.run(faults="mail_after_send:1", env=smtp_env(smtp_server))
    assert crashed.returncode == -signal.SIGKILL
    assert len(smtp_server.messages) == 1
    assert MailDelivery.objects.get().state == "sending"
    assert workers.run(env=smtp_env(smtp_server)).returncode == 0
    mail.refresh_from_db()
    assert (mail.state, mail.possibly_duplicate, mail.guarantee) == ("sent", True, "at-least-once")
    assert "possibly sent twice" in mail.last_error
    assert JobEvent.objects.filter(job_id=mail.job_id, kind="possibly_sent_twice").exists()
    # Sent twice, honestly: both copies carry the same Message-ID.
    assert [m.header("Message-ID") for m in smtp_server.messages] == [mail.message_id] * 2


def test_mail__crash_before_the_checkpoint_does_not_send_again(workers, recipient, smtp_server):
    notify.publish("job.failed", "evt-mail", {"job_id": 1})
    assert workers.run(faults="after_unit:1", env=smtp_env(smtp_server)).returncode == (
        -signal.SIGKILL
    )
    assert workers.run(env=smtp_env(smtp_server)).returncode == 0
    mail = MailDelivery.objects.get()
    assert (mail.state, mail.possibly_duplicate) == ("sent", False)
    assert len(smtp_server.messages) == 1
    assert Job.objects.get(pk=mail.job_id).state == "completed"
