"""Queues, Workers, throughput and Discard: the operators' console, through the views."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from durable import jobs, rescue
from durable.models import Job, JobEvent, PausedQueue, WorkerProcess
from recovery.dashboard.serving import worker_status
from recovery.models import RecoveryEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(client_for):
    return client_for("admin")


def test_queues_page__counts_flags_unserved_and_pauses_with_audit(admin):
    jobs.enqueue("durable.noop", {}, queue="mail")
    jobs.enqueue("durable.noop", {}, queue="mail", run_after=timezone.now() + timedelta(hours=1))
    rescue.register_inline("w-1", lease_seconds=30)
    WorkerProcess.objects.filter(worker_id="w-1").update(queues=["default"])
    jobs.enqueue("durable.noop", {})
    page = admin.get(reverse("problems:queues"))
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-queue="mail"' in html
    assert "No live worker serves this queue" in html  # mail: nobody; default: w-1
    assert html.count("No live worker serves this queue") == 1
    assert 'class="chart throughput"' in html
    # the job's row says why it waits, instead of "due" forever
    listing = admin.get(reverse("problems:jobs") + "?queue=mail").content.decode()
    assert "no live worker serves queue mail" in listing
    response = admin.post(reverse("problems:queue-change", args=["pause"]), {"queue": "default"})
    assert response.status_code == 302
    assert PausedQueue.objects.filter(queue="default", paused_by="admin").exists()
    audit = RecoveryEvent.objects.get(type="queue-action")
    assert "pause queue default" in audit.detail
    listing = admin.get(reverse("problems:jobs") + "?queue=default").content.decode()
    assert "queue default is paused" in listing
    admin.post(reverse("problems:queue-change", args=["resume"]), {"queue": "default"})
    assert not PausedQueue.objects.exists()
    assert RecoveryEvent.objects.filter(type="queue-action").count() == 2


def test_queue_pause__a_name_no_job_can_have_is_refused_clearly(admin):
    response = admin.post(
        reverse("problems:queue-change", args=["pause"]), {"queue": "a b"}, follow=True
    )
    assert response.status_code == 200
    assert "Not paused: queue &#x27;a b&#x27; must be 1 to 64 letters" in response.content.decode()
    assert not PausedQueue.objects.exists()
    assert not RecoveryEvent.objects.filter(type="queue-action").exists()


def test_queue_pause__needs_its_own_permission(client_for):
    jobs.enqueue("durable.noop", {})  # a queue row, whose button the operator must not get
    operator = client_for("operator")  # every job right, but not pause_queue
    assert b'data-queue="default"' in operator.get(reverse("problems:queues")).content
    response = operator.post(reverse("problems:queue-change", args=["pause"]), {"queue": "x"})
    assert response.status_code == 403
    assert not PausedQueue.objects.exists()
    assert b"act-pause" not in operator.get(reverse("problems:queues")).content


def test_workers_page__live_clean_lost_and_exit_70_with_held_jobs(admin):
    for worker_id in ("live", "clean", "lost", "hung"):
        rescue.register_inline(worker_id, lease_seconds=30)
    rescue.mark_stopped("clean")
    rescue.record_exit_reason("hung", WorkerProcess.EXIT_UNIT_TIMEOUT)
    WorkerProcess.objects.filter(worker_id="lost").update(stopped_at=timezone.now(),
                                                          exit_reason="lost")  # fmt: skip
    job = jobs.enqueue("durable.noop", {"units": 5})
    Job.objects.filter(pk=job.pk).update(
        state="running", lease_owner="live", lease_expires_at=timezone.now() + timedelta(60),
        units_done=2, units_total=5,
    )  # fmt: skip
    html = admin.get(reverse("problems:workers")).content.decode()
    for text in ("Live", "Stopped cleanly", "Lost (killed or crashed)", "Exit 70"):
        assert text in html, text
    assert f"#{job.pk}</a>" in html
    assert "unit 3 of 5" in html


def test_worker_status__is_decided_from_the_row():
    now = timezone.now()
    base = {"heartbeat_at": now, "lease_seconds": 10, "now": now}
    assert worker_status(stopped_at=None, exit_reason="", **base) == "live"
    assert worker_status(stopped_at=now, exit_reason="clean", **base) == "clean"
    assert worker_status(stopped_at=now, exit_reason="lost", **base) == "lost"
    assert worker_status(stopped_at=now, exit_reason="unit-timeout", **base) == "unit-timeout"
    assert worker_status(stopped_at=None, exit_reason="unit-timeout", **base) == "unit-timeout"
    stale = {**base, "heartbeat_at": now - timedelta(minutes=5)}
    assert worker_status(stopped_at=None, exit_reason="", **stale) == "silent"


def test_throughput__counts_completed_failed_and_retried_per_minute(admin):
    now = timezone.now()
    done = jobs.enqueue("durable.noop", {})
    failed = jobs.enqueue("durable.noop", {}, queue="mail")
    Job.objects.filter(pk=done.pk).update(state="completed", finished_at=now)
    Job.objects.filter(pk=failed.pk).update(state="failed", finished_at=now)
    JobEvent.objects.create(job_id=done.pk, seq=99, kind="retry_scheduled", created_at=now)
    html = admin.get(reverse("problems:summary")).content.decode()
    assert "1 completed, 1 failed, 1 retried" in html
    html = admin.get(reverse("problems:queues") + "?queue=mail&range=day").content.decode()
    assert "0 completed, 1 failed, 0 retried" in html
    assert admin.get(reverse("problems:queues") + "?range=bogus&queue=%00").status_code == 200


def test_discard__finished_only_with_its_own_permission_and_audit(admin, client_for):
    done = jobs.enqueue("durable.noop", {})
    queued = jobs.enqueue("durable.noop", {})
    Job.objects.filter(pk=done.pk).update(state="completed", finished_at=timezone.now())
    changer = client_for("changer")  # change_job implies pause/cancel/retry, never delete
    url = reverse("problems:job-action", args=[done.pk, "discard"])
    assert changer.post(url).status_code == 403
    assert Job.objects.filter(pk=done.pk).exists()
    admin.post(url)
    assert not Job.objects.filter(pk=done.pk).exists()
    assert RecoveryEvent.objects.filter(type="job-discarded").count() == 1
    admin.post(reverse("problems:job-action", args=[queued.pk, "discard"]))
    assert Job.objects.get(pk=queued.pk).state == "queued"  # unfinished: never deleted
    audit = RecoveryEvent.objects.filter(type="job-discarded").order_by("-id").first()
    assert not audit.done


def test_discard__selected_rows_keep_the_unfinished(admin):
    done = [jobs.enqueue("durable.noop", {}) for _ in range(3)]
    Job.objects.filter(pk__in=[j.pk for j in done]).update(state="failed")
    running = jobs.enqueue("durable.noop", {})
    ids = [*(j.pk for j in done), running.pk]
    form = {"action": "discard", "scope": "selected", "ids": ids, "confirmed": "1"}
    admin.post(reverse("problems:bulk"), form)
    assert list(Job.objects.values_list("pk", flat=True)) == [running.pk]


def test_admin_index_links_to_the_dashboard(admin):
    html = admin.get(reverse("admin:index")).content.decode()
    assert f'href="{reverse("problems:summary")}"' in html


def test_jobs_search__reaches_error_messages(admin):
    job = jobs.enqueue("durable.noop", {})
    Job.objects.filter(pk=job.pk).update(state="failed", reason="Quota exceeded for bucket photos")
    jobs.enqueue("durable.noop", {})
    html = admin.get(reverse("problems:jobs") + "?q=quota+EXCEEDED").content.decode()
    assert f'id="job-{job.pk}"' in html
    assert html.count('class="job state-') == 1


def test_sortable_columns__jobs_and_security(admin):
    import re

    from recovery.records import record_security

    low = jobs.enqueue("durable.noop", {})
    high = jobs.enqueue("durable.noop", {})
    Job.objects.filter(pk=high.pk).update(attempts=3)

    def order(params):
        html = admin.get(reverse("problems:jobs"), params).content.decode()
        return [int(n) for n in re.findall(r'id="job-(\d+)"', html)]

    assert order({}) == [high.pk, low.pk]  # newest first
    assert order({"sort": "created"}) == [low.pk, high.pk]
    assert order({"sort": "attempts"}) == [low.pk, high.pk]
    assert order({"sort": "-attempts"}) == [high.pk, low.pk]
    assert order({"sort": "bogus"}) == [high.pk, low.pk]  # unknown: the default, no 500
    html = admin.get(reverse("problems:jobs"), {"sort": "-attempts"}).content.decode()
    assert "sort=attempts" in html  # the header's link reverses the order
    for _ in range(3):
        record_security(category="ssrf", key="many", ip="203.0.113.1")
    record_security(category="csrf", key="once", ip="203.0.113.2")
    html = admin.get(reverse("problems:security"), {"sort": "-count"}).content.decode()
    assert html.index("many") < html.index("once")
    html = admin.get(reverse("problems:security")).content.decode()
    assert html.index("once") < html.index("many")  # latest first


def test_recovery_search__reaches_actor_user_id_and_addresses(admin):
    from django.utils.html import escape

    from recovery.records import record_event

    by_alice = record_event("board-permanently-deleted", username="alice", user_id="u-17",
                            deleted_data=True,
                            ip="203.0.113.9", detail="Deleted a board")  # fmt: skip
    by_v6 = record_event("restore-backup", ip="2001:db8::5", detail="Restored")
    about_alice = record_event("backup-created", detail="alice's boards backed up")
    record_event("backup-created", detail="nothing to see")

    def found(q, **extra):
        html = admin.get(reverse("problems:recovery"), {"q": q, **extra}).content.decode()
        return {e.pk for e in RecoveryEvent.objects.all() if escape(e.detail) in html}

    assert found("alice") == {by_alice.pk, about_alice.pk}  # by name, and in the text
    assert found("u-17") == {by_alice.pk}
    assert found("203.0.113.9") == {by_alice.pk}
    assert found("2001:DB8::5") == {by_v6.pk}  # the address, however it is written
    assert found("alice", status="deleted") == {by_alice.pk}


def test_discard_from_its_own_page_without_javascript_goes_back_to_the_list(admin):
    job = jobs.enqueue("durable.noop", {})
    Job.objects.filter(pk=job.pk).update(state="cancelled")
    page = reverse("problems:job", args=[job.pk])
    response = admin.post(reverse("problems:job-action", args=[job.pk, "discard"]), {"next": page})
    assert response.status_code == 302
    assert response["Location"] == reverse("problems:jobs")
    assert admin.post(reverse("problems:queue-change", args=["explode"])).status_code == 404


def test_discard_all_matching__runs_as_the_bulk_job_and_keeps_the_unfinished(admin):
    from tests.integration.helpers import drain

    finished = [jobs.enqueue("durable.noop", {}, queue="old") for _ in range(3)]
    Job.objects.filter(pk__in=[j.pk for j in finished]).update(state="completed")
    waiting = jobs.enqueue("durable.noop", {}, queue="old")
    elsewhere = jobs.enqueue("durable.noop", {})
    Job.objects.filter(pk=elsewhere.pk).update(state="completed")
    data = {"action": "discard", "scope": "filter", "filter_queue": "old",
            "upto": str(elsewhere.pk), "confirmed": "1"}  # fmt: skip
    admin.post(reverse("problems:bulk"), data)
    bulk_job = Job.objects.get(operation="recovery.bulk_action")
    assert bulk_job.input["filter"]["queue"] == "old"
    drain(bulk_job.pk)
    assert Job.objects.get(pk=bulk_job.pk).state == "completed"
    left = set(Job.objects.exclude(pk=bulk_job.pk).values_list("pk", flat=True))
    assert left == {waiting.pk, elsewhere.pk}  # unfinished and other queue stay
    summary = RecoveryEvent.objects.filter(type="job-bulk-action").order_by("-id").first()
    assert "3 applied" in summary.detail
    assert "1 refused" in summary.detail
