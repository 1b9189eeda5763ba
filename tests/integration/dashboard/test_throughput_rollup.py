"""The hourly throughput rollup: its numbers equal a live count of the same jobs, as hours
close between requests, and counted hours keep what happened after jobs are deleted."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from durable import jobs
from durable.models import Job, JobEvent
from recovery.dashboard import rollup
from recovery.dashboard import throughput as tp
from recovery.dashboard.models import ThroughputCount, ThroughputHour

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 20, 10, 3, 30, tzinfo=UTC)  # 3.5 min into 10h: 9h not settled
QUEUES = ("default", "mail", "files")
OPERATIONS = ("durable.noop", "mail.send")
RETRY_BEFORE = timedelta(minutes=2)


def finished_jobs(moments: list[datetime], seed: int = 1, state: str = "") -> list[Job]:
    """Jobs finished at ``moments`` (a benchmark-style shortcut: the engine's own path is
    covered elsewhere), some with retry events, in every finished state."""
    rng = random.Random(seed)
    rows = [
        Job(
            operation=rng.choice(OPERATIONS),
            queue=rng.choice(QUEUES),
            state=state or rng.choice(["completed", "completed", "failed", "cancelled"]),
            finished_at=at,
            created_at=at - timedelta(minutes=5),
        )
        for at in moments
    ]
    made = Job.objects.bulk_create(rows)
    made = list(Job.objects.filter(finished_at__in=moments).order_by("id"))
    events = [
        JobEvent(job=job, seq=1, kind="retry_scheduled", created_at=job.finished_at - RETRY_BEFORE)
        for job in made
        if rng.random() < 0.3
    ]  # fmt: skip
    JobEvent.objects.bulk_create(events)
    return made


def spread(now: datetime, count: int, seed: int = 2) -> list[datetime]:
    rng = random.Random(seed)
    return [now - timedelta(seconds=rng.uniform(0, 7.2 * 86400)) for _ in range(count)]


def both(now: datetime, range_name: str = "week", **narrow: str) -> tuple[dict, dict]:
    start = tp.first_slot(now, range_name)
    rolled = rollup.hourly_counts(start, now, range_name, **narrow)
    live = rollup.live_counts(start, range_name, **narrow)
    in_range = lambda c: {k: v for k, v in c.items() if start <= k[0] <= now}  # noqa: E731
    return in_range(rolled), in_range(live)


def test_rollup__equals_the_live_count_for_every_queue_and_operation():
    finished_jobs(spread(NOW, 400))
    rolled, live = both(NOW)
    assert rolled == live
    assert sum(live.values()) > 250  # a real sample: jobs and retries in the week
    settled = rollup.hours_between(tp.first_slot(NOW, "week"), rollup.settled_until(NOW))
    assert ThroughputHour.objects.count() == len(settled) == 24 * 7 - 2
    assert ThroughputCount.objects.exists()
    narrows = [{"queue": "mail"}, {"operation": "mail.send"}, {"queue": "nowhere"},
               {"queue": "files", "operation": "durable.noop"}]  # fmt: skip
    for narrow in narrows:
        rolled, live = both(NOW, **narrow)
        assert rolled == live, narrow
        rolled, live = both(NOW, "day", **narrow)
        assert rolled == live, narrow
    markers = ThroughputHour.objects.count()
    both(NOW)  # read again: nothing counted twice
    assert ThroughputHour.objects.count() == markers
    assert both(NOW)[0] == both(NOW)[1]


def test_rollup__hours_that_close_between_two_requests_and_a_late_finish():
    nine = NOW.replace(minute=0, second=0) - timedelta(hours=1)
    finished_jobs([nine + timedelta(minutes=10), nine + timedelta(minutes=50),
                   NOW - timedelta(minutes=2)], seed=3, state="completed")  # fmt: skip
    rolled, live = both(NOW)
    assert rolled == live
    assert not ThroughputHour.objects.filter(hour=nine).exists()  # 9h still settling: live
    # A finish stamped 9:59:59 that commits after the first request (a lock wait).
    finished_jobs([nine + timedelta(minutes=59, seconds=59)], seed=4, state="failed")
    later = NOW + timedelta(minutes=30)  # 9h settled now, 10h open
    rolled, live = both(later)
    assert rolled == live
    assert ThroughputHour.objects.filter(hour=nine).exists()
    nine_counts = sum(v for (slot, _), v in live.items() if slot == nine)
    assert nine_counts == sum(
        ThroughputCount.objects.filter(hour=nine).values_list("count", flat=True)
    )
    assert nine_counts >= 3
    finished_jobs([later - timedelta(minutes=1)], seed=5)
    rolled, live = both(later + timedelta(hours=1, minutes=10))  # 10h closed and counted
    assert rolled == live
    assert ThroughputHour.objects.filter(hour=nine + timedelta(hours=1)).exists()


def test_rollup__a_counted_hour_keeps_jobs_deleted_afterwards():
    made = finished_jobs(spread(NOW, 120), seed=6)
    before, _ = both(NOW)
    old = [
        j.pk for j in made if j.finished_at < NOW - timedelta(hours=3) and j.state != "cancelled"
    ]
    jobs.discard(old)  # deleted with their events, as retention would
    after, live = both(NOW)
    assert after == before  # the chart says what happened
    assert sum(live.values()) < sum(before.values())  # a live count would have lost them


def test_rollup__forget_drops_the_counts_and_they_are_counted_again():
    finished_jobs(spread(NOW, 50), seed=7)
    first, live = both(NOW)
    rollup.forget("default")
    assert not ThroughputHour.objects.exists()
    assert not ThroughputCount.objects.exists()
    assert both(NOW) == (first, live)


def test_day_chart__shows_a_job_finished_now_at_once(client_for):
    """No per-process cache any more: the open hour is always counted live."""
    admin = client_for("admin")
    url = reverse("problems:queues")
    assert "0 completed" in admin.get(url, {"range": "day"}).content.decode()
    job = jobs.enqueue("durable.noop", {})
    Job.objects.filter(pk=job.pk).update(state="completed", finished_at=timezone.now())
    assert "1 completed" in admin.get(url, {"range": "day"}).content.decode()
    assert "1 completed" in admin.get(url, {"range": "week"}).content.decode()
    assert "1 completed" in admin.get(url, {"range": "hour"}).content.decode()


def test_discard_from_the_console__the_hour_it_finished_in_still_counts_it(client_for):
    """No chart was drawn before: the Discard counts the settled hours first."""
    admin = client_for("admin")
    job = jobs.enqueue("durable.noop", {})
    three_hours_ago = timezone.now() - timedelta(hours=3)
    Job.objects.filter(pk=job.pk).update(state="completed", finished_at=three_hours_ago)
    assert not ThroughputHour.objects.exists()
    admin.post(reverse("problems:job-action", args=[job.pk, "discard"]))
    assert not Job.objects.filter(pk=job.pk).exists()
    html = admin.get(reverse("problems:queues"), {"range": "week"}).content.decode()
    assert "1 completed" in html
