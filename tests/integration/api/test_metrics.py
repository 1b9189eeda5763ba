"""GET /metrics: parsed with prometheus_client's own parser, fed by real runworker processes."""

from __future__ import annotations

import re
import signal
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.test import Client as DjangoClient
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from durable import jobs
from durable.http.gates import CAUSES
from durable.metrics.collector import WORKER_STATES, worker_state
from durable.metrics.models import MetricsCursor
from durable.metrics.totals import (
    ADVANCE,
    FINISHED,
    HTTP_SOURCES,
    OTHER_PROVIDER,
    RUN_BUCKETS,
    SETTLE,
    advance,
    finished_totals,
    known_providers,
    next_upto,
    reclaim_totals,
    settle,
)
from durable.models import Job, JobEvent
from durable.states import JobState
from recovery.models import RecoveryEvent, SecurityEvent, Severity

FAMILIES = {
    "durable_jobs",
    "durable_queue_oldest_ready_age_seconds",
    "durable_jobs_finished",
    "durable_job_run_seconds",
    "durable_reclaims",
    "durable_workers",
    "durable_queue_live_workers",
    "durable_http_gate_slots_in_use",
    "durable_http_retries",
    "durable_http_retry_wait_seconds",
    "durable_http_gate_waits",
    "durable_http_gate_wait_seconds",
    "recovery_events",
    "durable_security_refusals",
}


def parse(text: str) -> dict[str, list]:
    """family name -> samples (name, labels, value), by prometheus_client's parser."""
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(families: dict, sample: str, **labels: str) -> float:
    family = sample.removesuffix("_total").removesuffix("_count").removesuffix("_sum")
    family = family.removesuffix("_bucket")
    return sum(
        s.value
        for s in families.get(family, [])
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    )


def scrape(http, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return http.get("/metrics", headers=headers)


# --- pure decisions ---------------------------------------------------------------------


def test_worker_state__by_stop_and_heartbeat():
    now = timezone.now()
    assert worker_state(stopped_at=None, heartbeat_at=now, lease_seconds=10, now=now) == "live"
    old = now - timedelta(hours=1)
    assert worker_state(stopped_at=None, heartbeat_at=old, lease_seconds=10, now=now) == (
        "unresponsive"
    )
    assert worker_state(stopped_at=now, heartbeat_at=now, lease_seconds=10, now=now) == "stopped"


# --- access -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_access__token_scope_and_staff_session(make_client):
    http = DjangoClient()
    _, reader = make_client("prom", ("metrics:read",))
    _, other = make_client("ci", ("jobs:read",))
    missing = http.get("/metrics")
    assert missing.status_code == 401
    assert missing["WWW-Authenticate"].startswith("Bearer")
    assert http.get("/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401
    wrong = http.get("/metrics", headers={"Authorization": f"Bearer {other}"})
    assert wrong.status_code == 403
    assert 'scope="metrics:read"' in wrong["WWW-Authenticate"]
    ok = http.get("/metrics", headers={"Authorization": f"Bearer {reader}"})
    assert ok.status_code == 200, ok.content
    assert ok["Content-Type"].startswith("text/plain")
    assert set(parse(ok.content.decode())) >= FAMILIES
    assert http.post("/metrics", headers={"Authorization": f"Bearer {reader}"}).status_code == 405
    # The refusals are tallied like any API refusal: the next scrape counts them.
    again = parse(
        http.get("/metrics", headers={"Authorization": f"Bearer {reader}"}).content.decode()
    )
    assert value(again, "durable_security_refusals_total", category="api-auth") == 3

    user_model = get_user_model()
    staff = user_model.objects.create_user("ops", password="pw", is_staff=True)
    plain = user_model.objects.create_user("someone", password="pw", is_staff=False)
    http.force_login(plain)
    assert http.get("/metrics").status_code == 401
    http.force_login(staff)
    assert http.get("/metrics").status_code == 200


@pytest.mark.django_db
def test_docs__the_how_to_lists_exactly_the_families_a_scrape_gives(make_client):
    """docs/how-to/monitor.md's table, against what the endpoint really writes."""
    page = Path(__file__).resolve().parents[3] / "docs" / "how-to" / "monitor.md"
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", page.read_text(), flags=re.MULTILINE))
    _, reader = make_client("prom", ("metrics:read",))
    text = DjangoClient().get("/metrics", headers={"Authorization": f"Bearer {reader}"})
    assert documented == set(parse(text.content.decode())) == FAMILIES


@pytest.mark.django_db
def test_recovery_events__by_severity_and_failed_and_refusals_by_category(make_client):
    _, reader = make_client("prom", ("metrics:read",))
    for severity, done, n in (
        ("info", True, 4),
        ("info", False, 1),
        ("error", False, 2),
        ("warning", None, 3),
    ):
        for _ in range(n):
            RecoveryEvent.objects.create(type="t", severity=severity, done=done)
    SecurityEvent.objects.create(category="ssrf", key="k", count=7)
    got = parse(
        DjangoClient()
        .get("/metrics", headers={"Authorization": f"Bearer {reader}"})
        .content.decode()
    )
    # done: True and None (legacy) are done; False is failed.
    assert value(got, "recovery_events_total", failed="true") == 3
    assert value(got, "recovery_events_total", failed="false") == 7
    assert value(got, "recovery_events_total", severity="info", failed="false") == 4
    assert value(got, "recovery_events_total", severity="info", failed="true") == 1
    assert value(got, "recovery_events_total", severity="error", failed="true") == 2
    assert value(got, "recovery_events_total", severity="warning", failed="false") == 3
    # Every (severity, failed) pair is present, zero or not: an alert rule never sees none.
    pairs = {
        (s.labels["severity"], s.labels["failed"])
        for s in got["recovery_events"]
        if s.name == "recovery_events_total"
    }
    assert pairs == {(v, f) for v in Severity.values for f in ("true", "false")}
    assert value(got, "durable_security_refusals_total", category="ssrf") == 7

    # An event whose severity is corrected moves between the counts (the counting
    # triggers follow updates of the severity too).
    RecoveryEvent.objects.filter(severity="error").update(severity="warning")
    again = parse(
        DjangoClient()
        .get("/metrics", headers={"Authorization": f"Bearer {reader}"})
        .content.decode()
    )
    assert value(again, "recovery_events_total", severity="error") == 0
    assert value(again, "recovery_events_total", severity="warning", failed="true") == 2
    assert value(again, "recovery_events_total") == 10


# --- real workers, two real web processes -----------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_scrape__counts_real_jobs_and_two_web_processes_agree(
    workers, make_client, live_server_factory
):
    _, reader = make_client("prom", ("metrics:read",))
    done = jobs.enqueue("test.rows", {"units": 2}, queue="default")
    failed = jobs.enqueue("test.flaky", {"fail_times": 9, "error": "nonretryable"}, queue="default")
    first = workers.run()
    assert first.returncode == 0, workers.log(first)
    # One more, killed mid-job, then finished by another worker: a reclaim.
    crashed = jobs.enqueue("test.rows", {"units": 5}, queue="default")
    killed = workers.run(faults="after_unit:3")
    assert killed.returncode == -signal.SIGKILL
    finisher = workers.run()
    assert finisher.returncode == 0, workers.log(finisher)
    states = dict(
        Job.objects.filter(pk__in=[done.pk, failed.pk, crashed.pk]).values_list("pk", "state")
    )
    assert states == {done.pk: "completed", failed.pk: "failed", crashed.pk: "completed"}
    waiting = jobs.enqueue("test.rows", {"units": 1}, queue="later")
    Job.objects.filter(pk=waiting.pk).update(
        next_attempt_at=timezone.now() - timedelta(seconds=120)
    )

    one = live_server_factory(workers=1)
    two = live_server_factory(workers=1)
    texts = []
    for server in (one, two):
        with httpx.Client(base_url=server.url, timeout=30) as http:
            response = scrape(http, reader)
            assert response.status_code == 200, server.log()
            texts.append(response.text)
    figures = [parse(text) for text in texts]
    got = figures[0]

    # durable_jobs: every job kept, by queue and state.
    assert {(s.labels["queue"], s.labels["state"]): s.value for s in got["durable_jobs"]} == {
        ("default", "completed"): 2,
        ("default", "failed"): 1,
        ("later", "queued"): 1,
    }
    assert value(got, "durable_queue_oldest_ready_age_seconds", queue="later") >= 120
    assert value(got, "durable_queue_oldest_ready_age_seconds", queue="default") == 0
    assert (
        value(got, "durable_jobs_finished_total", operation="test.rows", outcome="completed") == 2
    )
    assert value(got, "durable_jobs_finished_total", operation="test.flaky", outcome="failed") == 1
    assert value(got, "durable_job_run_seconds_count", operation="test.rows") == 2
    assert value(got, "durable_job_run_seconds_bucket", operation="test.rows", le="+Inf") == 2
    assert value(got, "durable_reclaims_total", operation="test.rows") == 1
    assert value(got, "durable_workers", state="stopped") == 3 - value(
        got, "durable_workers", state="unresponsive"
    )
    assert value(got, "durable_workers", state="live") == 0
    assert value(got, "durable_queue_live_workers", queue="default") == 0
    # A queue nobody ever served shows 0 rather than being absent (an alert needs it).
    live_per_queue = {s.labels["queue"]: s.value for s in got["durable_queue_live_workers"]}
    assert live_per_queue.get("later") == 0

    # Whichever web process answers, the same figures (the age grows between the two).
    def steady(families: dict) -> dict:
        return {
            (name, s.name, tuple(sorted(s.labels.items()))): s.value
            for name, samples in families.items()
            if name != "durable_queue_oldest_ready_age_seconds"
            for s in samples
        }

    assert steady(figures[0]) == steady(figures[1])

    # Labels only from bounded sets.
    queues = set(Job.objects.values_list("queue", flat=True))
    operations = set(Job.objects.values_list("operation", flat=True))
    allowed = {
        "queue": queues,
        "operation": operations,
        "state": set(JobState.values) | set(WORKER_STATES),
        "outcome": {str(s) for s in FINISHED},
        "attempt_spent": {"true", "false"},
        "failed": {"true", "false"},
        "severity": set(Severity.values),
        "provider": set(known_providers()) | {OTHER_PROVIDER},
        "source": set(HTTP_SOURCES),
        "cause": set(CAUSES),
        "category": {"api-auth"} | set(SecurityEvent.objects.values_list("category", flat=True)),
    }
    for name, samples in got.items():
        for s in samples:
            for label, text in s.labels.items():
                if label == "le":
                    continue
                assert text in allowed[label], (name, label, text)


# --- the settled totals ------------------------------------------------------------------


def test_next_upto__moves_only_by_a_whole_step_and_never_into_the_settle_window():
    now = timezone.now()
    assert next_upto(now - SETTLE - ADVANCE / 2, now) is None
    assert next_upto(now - SETTLE - ADVANCE, now) == now - SETTLE


@pytest.mark.django_db
def test_totals__a_purged_job_stays_counted_and_an_interval_is_added_once():
    now = timezone.now()
    hour_ago = now - timedelta(hours=1)
    for seconds in (0.05, 2.0, 100.0):
        Job.objects.create(
            operation="test.rows",
            state="completed",
            started_at=hour_ago - timedelta(seconds=seconds),
            finished_at=hour_ago,
        )
    Job.objects.create(operation="test.rows", state="failed", finished_at=now)  # live, never ran
    totals = finished_totals(settle(now))
    done = totals[("default", "test.rows", "completed")]
    assert (done.count, done.run_count) == (3, 3)
    assert done.buckets[RUN_BUCKETS.index(0.1)] == 1
    assert done.buckets[RUN_BUCKETS.index(5.0)] == 2
    assert done.buckets[-1] == 3
    assert done.run_sum == pytest.approx(102.05, abs=0.01)
    assert totals[("default", "test.rows", "failed")].run_count == 0
    assert MetricsCursor.objects.get().upto == now - SETTLE

    Job.objects.filter(state="completed").delete()  # retention purges them
    assert finished_totals(settle(now))[("default", "test.rows", "completed")].count == 3
    # A peer that read the old cursor and comes second adds nothing.
    assert advance(hour_ago - timedelta(hours=1), now - SETTLE) is False
    assert (
        finished_totals(settle(now + timedelta(minutes=2)))[
            ("default", "test.rows", "completed")
        ].count
        == 3
    )


@pytest.mark.django_db
def test_totals__reclaims_stay_counted_after_the_purge_and_are_added_once():
    now = timezone.now()
    hour_ago = now - timedelta(hours=1)

    def reclaimed(job: Job, seq: int, at, spent) -> None:
        data = {} if spent is None else {"attempt_spent": spent}
        JobEvent.objects.create(job=job, seq=seq, kind="reclaimed", data=data, created_at=at)

    old = Job.objects.create(operation="test.rows", state="completed", finished_at=hour_ago)
    reclaimed(old, 1, hour_ago, True)
    reclaimed(old, 2, hour_ago, False)
    reclaimed(old, 3, hour_ago, None)  # an older release's event: every death spent one
    recent = Job.objects.create(operation="test.flaky", state="running")
    reclaimed(recent, 1, now, False)  # inside the settle window: counted live

    expected = {("test.rows", True): 2, ("test.rows", False): 1, ("test.flaky", False): 1}
    assert reclaim_totals(settle(now)) == expected
    Job.objects.filter(pk=old.pk).delete()  # the retention purge takes its events too
    assert reclaim_totals(settle(now)) == expected
    later = now + timedelta(minutes=5)  # the live one is settled now, and counted once
    assert reclaim_totals(settle(later)) == expected
    assert reclaim_totals(settle(later + timedelta(minutes=5))) == expected
