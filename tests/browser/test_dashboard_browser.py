"""The dashboard in a real browser: log in, search, page, act on jobs a real worker runs,
watch progress — with no console error on any page and no full reload where htmx swaps.

``transaction=True``: gunicorn and the worker are other processes; they only see
committed rows.
"""

from __future__ import annotations

import re

import pytest

from durable import jobs
from durable.models import Job
from durable.schedules.models import Schedule
from durable.schedules.service import add_schedule
from recovery.records import record_event, record_security
from tests.conftest import wait_until

try:
    from playwright.sync_api import expect
except ImportError:  # the chromium fixture skips (or fails under CI) first
    expect = None

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def recovery_rows(ui) -> list[str]:
    return ui.page.locator("table.recovery tbody tr:not(.empty)").all_inner_texts()


def test_every_page__renders_cleanly_and_escapes_hostile_text(ui, staff, workers):
    for n in range(14):
        record_event("backup-created", db="wekan", detail=f"Backed up wekan-{n}.sqlite to backup/")
    record_event("corruption-detected", severity="error", done=False, db="wekan",
                 detail="<script>window.__xss = 1</script> found in boards.sqlite")  # fmt: skip
    record_event("board-permanently-deleted", deleted_data=True, username="alice",
                 ip="203.0.113.9", object_ids=["b1", "b2"], object_titles=["Roadmap", "Ops"],
                 detail='"><img src=x onerror="window.__xss = 2">')  # fmt: skip
    record_event("y" * 100, db="d" * 100, detail="x" * 400, severity="warning")  # unbroken text
    for n in range(30):
        record_security(category="api-auth", key="invalid-token", ip=f"198.51.100.{n}")
    record_security(category="ssrf", key="webhook.url", cwe=918, severity="error",
                    username="alice", ip="203.0.113.9")  # fmt: skip
    running = jobs.enqueue("durable.noop", {"units": 400, "sleep": 0.05}, owner="alice")
    jobs.enqueue("test.flaky", {"fail_times": 9, "error": "nonretryable", "message": "disk full"})
    paused = jobs.enqueue("durable.noop", {"units": 3})
    jobs.pause(paused.pk, actor="admin")
    add_schedule("nightly-scan", "integrity.scan", cron="30 3 * * *",
                 input={"target": "database", "database": "default"})  # fmt: skip
    workers.start("--operation", "durable.noop", "--operation", "test.flaky")
    started = Job.objects.filter(pk=running.pk, state="running", units_done__gt=0)
    wait_until(started.exists)

    ui.login("admin")
    ui.shot("summary")
    expect(ui.page.locator("svg.chart rect.bar-all")).to_have_count(30)
    expect(ui.page.locator("#in-progress")).to_contain_text("durable.noop")
    pages = [
        ("recovery", "/problems/recovery/"),
        ("security", "/problems/security/"),
        ("jobs", "/problems/jobs/"),
        ("job-detail", f"/problems/jobs/{running.pk}/"),
        ("new-job", "/problems/jobs/new/?operation=durable.noop"),
        ("record-event", "/problems/recovery/record/"),
        ("schedules", "/problems/schedules/"),
        ("new-schedule", "/problems/schedules/new/?operation=integrity.scan"),
    ]
    for name, path in pages:
        response = ui.go(path)
        assert response.status == 200
        assert response.headers["content-security-policy"].startswith("default-src 'self'")
        ui.shot(name)
    ui.go("/problems/recovery/")
    assert ui.page.evaluate("window.__xss === undefined")  # nothing injected ran
    expect(ui.page.locator("table.recovery")).to_contain_text("<script>window.__xss = 1</script>")
    # the long unbroken words wrap inside their cells: the table is no wider than its box
    overflow = ui.page.evaluate(
        "(() => { const w = document.querySelector('.table-wrap');"
        " return w.scrollWidth - w.clientWidth; })()"
    )
    assert overflow <= 1
    ui.go("/problems/security/")
    expect(ui.page.locator("table.security")).to_contain_text("and 29 others")
    ui.context.clear_cookies()
    ui.go("/problems/login/")
    ui.shot("login")


def test_recovery_search__filters_rows_in_place_and_keeps_the_url_true(ui, staff):
    for n in range(20):
        record_event("backup-created", detail=f"Backed up wekan-{n}.sqlite")
    for n in range(3):
        record_event("corruption-detected", done=n != 1, detail=f"rare-needle.{n} (copy)")
    ui.login("admin", next_path="/problems/recovery/")
    expect(ui.page.locator(".results .total")).to_contain_text("23 events")
    ui.mark()
    ui.page.fill("input[name=q]", "RARE-NEEDLE.")  # case and the dot are literal
    expect(ui.page.locator(".results .total")).to_contain_text("3 events matching")
    assert len(recovery_rows(ui)) == 3
    # the canonical address: no "status=all&per_page=10" from the form's other fields
    expect(ui.page).to_have_url(ui.url("/problems/recovery/?q=RARE-NEEDLE."))
    ui.page.locator("label.seg-failed").click()
    expect(ui.page.locator(".results .total")).to_contain_text("1 event matching")
    expect(ui.page).to_have_url(ui.url("/problems/recovery/?q=RARE-NEEDLE.&status=failed"))
    assert recovery_rows(ui)[0].count("rare-needle.1") == 1
    assert ui.same_document()  # swapped in place, never reloaded
    ui.shot("recovery-search")
    # the address is the page: opening it afresh shows the same rows
    ui.go(ui.page.url.removeprefix(ui.site.url))
    expect(ui.page.locator(".results .total")).to_contain_text("1 event matching")
    expect(ui.page.locator("input[name=q]")).to_have_value("RARE-NEEDLE.")


def test_paging__forward_and_back_with_the_browser_history(ui, staff):
    for n in range(25):
        record_event("backup-created", detail=f"event-{n:02d}")
    ui.login("admin", next_path="/problems/recovery/")
    ui.mark()
    first = recovery_rows(ui)
    assert "event-24" in first[0]
    ui.page.locator(".results .bar:not(.bottom) a[rel=next]").click()
    expect(ui.page.locator(".pager .where").first).to_have_text("page 2 / 3")
    expect(ui.page).to_have_url(re.compile(r"\?page=2$"))
    assert "event-14" in recovery_rows(ui)[0]
    assert ui.same_document()
    ui.page.locator(".results .bar:not(.bottom) a[rel=last]").click()
    expect(ui.page.locator(".pager .where").first).to_have_text("page 3 / 3")
    numbers = [row.split("event-")[1][:2] for row in recovery_rows(ui)]
    assert numbers == ["04", "03", "02", "01", "00"]
    ui.page.go_back()
    expect(ui.page).to_have_url(re.compile(r"\?page=2$"))
    expect(ui.page.locator(".pager .where").first).to_have_text("page 2 / 3")
    assert "event-14" in recovery_rows(ui)[0]
    ui.page.go_back()
    expect(ui.page).to_have_url(re.compile(r"/problems/recovery/$"))
    expect(ui.page.locator(".pager .where").first).to_have_text("page 1 / 3")
    ui.page.go_forward()
    expect(ui.page.locator(".pager .where").first).to_have_text("page 2 / 3")


def test_jobs__pause_resume_and_cancel_a_job_a_real_worker_runs(ui, staff, workers):
    job = jobs.enqueue("durable.noop", {"units": 600, "sleep": 0.05})
    workers.start("--operation", "durable.noop")
    wait_until(lambda: Job.objects.filter(pk=job.pk, state="running").exists())
    ui.login("admin", next_path="/problems/jobs/")
    row = ui.page.locator(f"#job-{job.pk}")
    badge = row.locator(".badge")
    expect(badge).to_have_text("Running")
    ui.mark()
    row.locator("button.act-pause").click()
    expect(badge).to_have_text("Paused")
    expect(ui.page.locator("#messages")).to_contain_text(f"Job {job.pk} paused")
    assert ui.same_document()  # the row was swapped, the page not reloaded
    # the worker stops at the next unit boundary and lets the job go
    wait_until(lambda: Job.objects.filter(pk=job.pk, state="paused", lease_owner=None).exists())
    done_at_pause = Job.objects.get(pk=job.pk).units_done
    # Nothing on the page is active any more: the table's next poll is its last one.
    # Resume must start the polling again (the action's reply says "jobs-changed").
    expect(ui.page.locator("#results")).not_to_have_attribute("data-polling", "2s")
    row.locator("button.act-resume").click()
    expect(badge).to_have_text(re.compile("Queued|Running"))
    expect(badge).to_have_text("Running")  # the table polls while a job is active
    wait_until(lambda: Job.objects.get(pk=job.pk).units_done > done_at_pause)
    row.locator("button.act-cancel").click()  # hx-confirm is accepted by the fixture
    expect(badge).to_have_text(re.compile("Cancelling|Cancelled"))
    expect(badge).to_have_text("Cancelled")  # recorded by the worker, seen by polling
    assert ui.same_document()
    expect(ui.page.locator("#results")).not_to_have_attribute("data-polling", "2s")
    assert Job.objects.get(pk=job.pk).state == "cancelled"


def test_job_detail__cancel_a_queued_job(ui, staff):
    job = jobs.enqueue("durable.noop", {"units": 3}, run_after=None)
    ui.login("admin", next_path=f"/problems/jobs/{job.pk}/")
    expect(ui.page.locator("#job-detail .badge")).to_have_text("Queued")
    ui.mark()
    ui.page.locator("#job-detail button.act-cancel").click()
    expect(ui.page.locator("#job-detail .badge")).to_have_text("Cancelled")
    expect(ui.page.locator("#messages")).to_contain_text(f"Job {job.pk} cancelled")
    assert ui.same_document()
    assert Job.objects.get(pk=job.pk).state == "cancelled"
    expect(ui.page.locator("#job-detail")).not_to_have_attribute("data-polling", "2s")


def test_job_detail__cancel_a_running_job_and_watch_it_stop(ui, staff, workers):
    # The detail swapped in by the action polls the job's own URL (never the action's,
    # whose GET is a 405 — a console error the fixture would report) until it settles.
    job = jobs.enqueue("durable.noop", {"units": 600, "sleep": 0.05})
    workers.start("--operation", "durable.noop")
    wait_until(lambda: Job.objects.filter(pk=job.pk, state="running").exists())
    ui.login("admin", next_path=f"/problems/jobs/{job.pk}/")
    badge = ui.page.locator("#job-detail .badge")
    expect(badge).to_have_text("Running")
    ui.mark()
    ui.page.locator("#job-detail button.act-cancel").click()  # hx-confirm accepted
    expect(badge).to_have_text(re.compile("Cancelling|Cancelled"))
    expect(badge).to_have_text("Cancelled")  # written by the worker, seen by polling
    assert ui.same_document()
    expect(ui.page.locator("#job-detail")).not_to_have_attribute("data-polling", "2s")
    assert Job.objects.get(pk=job.pk).state == "cancelled"


def test_job_detail__a_job_purged_while_its_page_polls_stops_it_with_a_message(ui, staff):
    job = jobs.enqueue("durable.noop", {"units": 3})  # queued, no worker: the page polls
    ui.login("admin", next_path=f"/problems/jobs/{job.pk}/")
    expect(ui.page.locator("#job-detail")).to_have_attribute("data-polling", "2s")
    ui.mark()
    Job.objects.filter(pk=job.pk).delete()  # as retention purges a job
    # The next poll gets 286 (htmx stops polling), not a 404 every 2 s (console errors).
    expect(ui.page.locator("#messages")).to_contain_text(f"Job {job.pk} does not exist")
    expect(ui.page.locator("#job-detail")).to_have_attribute("data-state", "gone")
    expect(ui.page.locator("#job-detail")).not_to_have_attribute("hx-trigger", re.compile("."))
    requests: list[str] = []
    ui.page.on("request", lambda request: requests.append(request.url))
    ui.page.wait_for_timeout(4500)  # two poll periods: nothing is asked any more
    assert requests == []
    assert ui.same_document()


def test_job_detail__progress_bar_advances_while_a_worker_runs(ui, staff, workers):
    job = jobs.enqueue("durable.noop", {"units": 16, "sleep": 0.5})
    ui.login("admin", next_path=f"/problems/jobs/{job.pk}/")
    ui.mark()
    workers.start("--operation", "durable.noop")
    seen: list[int] = []

    def progress_settled() -> bool:
        # The badge first: a poll may swap the detail between the two reads, and a bar read
        # after a "Completed" badge is never older than it (read the other way round, a bar
        # of 14 from before the swap could pair with the final badge).
        completed = ui.page.locator("#job-detail .badge").inner_text() == "Completed"
        bar = ui.page.locator("#job-detail .detail-head progress")
        if bar.count():
            value = int(bar.get_attribute("value"))
            if not seen or value != seen[-1]:
                seen.append(value)
        return completed

    wait_until(progress_settled, timeout=60, interval=0.2)
    assert seen == sorted(seen), seen  # only forward
    assert any(0 < value < 16 for value in seen), seen  # seen part-way, not just the end
    assert seen[-1] == 16
    assert ui.same_document()  # polling swapped the detail; no reload
    expect(ui.page.locator("#job-detail")).not_to_have_attribute("data-polling", "2s")
    ui.shot("job-detail-completed")


def test_new_job_and_a_bulk_action_through_the_forms(ui, staff):
    queued = [jobs.enqueue("durable.noop", {"units": 1}) for _ in range(3)]
    ui.login("admin", next_path="/problems/jobs/new/")
    ui.page.get_by_role("link", name=re.compile("durable.noop")).click()
    ui.page.fill("textarea[name=input-input]", '{"units": "many"}')
    ui.page.get_by_role("button", name="Start job").click()
    expect(ui.page.locator(".field-error")).to_contain_text("units: must be an integer")
    ui.page.fill("textarea[name=input-input]", '{"units": 2}')
    ui.page.get_by_role("button", name="Start job").click()
    expect(ui.page.locator("#messages")).to_contain_text("(durable.noop) is queued")
    created = Job.objects.order_by("-id").first()
    assert created.input == {"units": 2, "sleep": 0}
    assert created.owner == "admin"

    ui.go("/problems/jobs/?state=queued")
    for job in queued[:2]:
        ui.page.check(f"#sel-{job.pk}")
    expect(ui.page.locator(".js-selected-count")).to_have_text("(2)")
    ui.page.select_option("select[name=action]", "cancel")
    ui.page.get_by_role("button", name=re.compile("Apply to selected")).click()
    expect(ui.page.locator("main")).to_contain_text("Cancel the 2 jobs you selected?")
    ui.shot("bulk-confirm")
    ui.page.get_by_role("button", name="Cancel 2 jobs").click()
    expect(ui.page.locator("#messages")).to_contain_text("2 cancelled.")
    expect(ui.page).to_have_url(re.compile(r"/problems/jobs/\?state=queued$"))
    states = [Job.objects.get(pk=job.pk).state for job in queued]
    assert states == ["cancelled", "cancelled", "queued"]


def test_schedules__add_one_through_the_form_then_disable_it(ui, staff):
    ui.login("admin", next_path="/problems/jobs/")
    ui.page.get_by_role("link", name="Schedules").first.click()
    ui.page.get_by_role("link", name="New schedule").click()
    ui.page.get_by_role("link", name=re.compile("durable.noop")).click()
    ui.page.fill("input[name=schedule-name]", "every-quarter-hour")
    ui.page.check("input[name=schedule-timing][value=interval]")
    ui.page.fill("input[name=schedule-every]", "15 minutes")
    ui.page.fill("textarea[name=input-input]", '{"units": 1}')
    ui.page.get_by_role("button", name="Add schedule").click()
    expect(ui.page.locator("#id_schedule-every-error")).to_contain_text("is not an interval")
    ui.page.fill("input[name=schedule-every]", "15m")
    ui.page.get_by_role("button", name="Add schedule").click()
    expect(ui.page.locator("#messages")).to_contain_text("Schedule 'every-quarter-hour' added")
    schedule = Schedule.objects.get(name="every-quarter-hour")
    row = ui.page.locator(f"#schedule-{schedule.pk}")
    expect(row).to_contain_text("every 15m")
    expect(row.locator(".badge")).to_have_text("Enabled")
    ui.shot("schedules")
    row.get_by_role("button", name="Disable").click()
    expect(ui.page.locator(f"#schedule-{schedule.pk} .badge")).to_have_text("Disabled")
    schedule.refresh_from_db()
    assert (schedule.enabled, schedule.next_run_at) == (False, None)
