"""The operators' console in a real browser, with real worker processes: pause a queue and
watch a worker leave its jobs alone, see why a job waits, read the Workers page, discard a
finished job, the throughput chart, and the dark theme."""

from __future__ import annotations

import re
import signal

import pytest

from durable import jobs
from durable.models import Job, WorkerProcess
from tests.conftest import wait_until

try:
    from playwright.sync_api import expect
except ImportError:  # the chromium fixture skips (or fails under CI) first
    expect = None

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_pause_a_queue__a_live_worker_stops_taking_its_jobs_until_resumed(ui, staff, workers):
    worker = workers.start("--operation", "durable.noop")
    wait_until(lambda: WorkerProcess.objects.filter(pid=worker.pid).exists())
    ui.login("admin", next_path="/problems/queues/")
    row = ui.page.locator('tr[data-queue="default"]')
    expect(row).to_contain_text("1")  # one live worker serves it
    row.get_by_role("button", name="Pause").click()
    expect(ui.page.locator("#messages")).to_contain_text("Queue default paused")
    expect(ui.page.locator('tr[data-queue="default"] .badge')).to_have_text("Paused")
    ui.shot("queues-paused")
    job = jobs.enqueue("durable.noop", {"units": 2})
    ui.page.wait_for_timeout(1500)  # a worker polling every 0.05 s would have taken it
    assert Job.objects.get(pk=job.pk).state == "queued"
    ui.go(f"/problems/jobs/{job.pk}/")
    expect(ui.page.locator("#job-detail")).to_contain_text("queue default is paused")
    ui.go("/problems/queues/")
    ui.page.locator('tr[data-queue="default"]').get_by_role("button", name="Resume").click()
    expect(ui.page.locator("#messages")).to_contain_text("Queue default resumed")
    wait_until(lambda: Job.objects.get(pk=job.pk).state == "completed", timeout=30)


def test_a_queue_no_worker_serves__is_flagged_and_its_jobs_say_so(ui, staff):
    job = jobs.enqueue("durable.noop", {"units": 1}, queue="nightly")
    ui.login("admin", next_path="/problems/queues/")
    expect(ui.page.locator('tr[data-queue="nightly"]')).to_contain_text("No live worker serves")
    ui.go("/problems/jobs/")
    expect(ui.page.locator(f"#job-{job.pk} .c-next")).to_contain_text(
        "no live worker serves queue nightly"
    )
    ui.shot("jobs-unserved")


def test_workers_page__live_then_stopped_cleanly_with_the_job_it_holds(ui, staff, workers):
    job = jobs.enqueue("durable.noop", {"units": 400, "sleep": 0.05})
    worker = workers.start("--operation", "durable.noop")
    wait_until(lambda: Job.objects.filter(pk=job.pk, state="running").exists())
    ui.login("admin", next_path="/problems/workers/")
    row = ui.page.locator("tr.worker").first
    expect(row.locator(".badge")).to_have_text("Live")
    expect(row).to_contain_text(f"#{job.pk}")
    ui.shot("workers-live")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0
    ui.go("/problems/workers/")
    expect(ui.page.locator("tr.worker").first.locator(".badge")).to_have_text("Stopped cleanly")


def test_discard_a_finished_job_from_its_row(ui, staff):
    job = jobs.enqueue("durable.noop", {"units": 1})
    Job.objects.filter(pk=job.pk).update(state="completed")
    ui.login("admin", next_path="/problems/jobs/")
    ui.mark()
    ui.page.locator(f"#job-{job.pk} button.act-discard").click()  # hx-confirm accepted
    expect(ui.page.locator("#messages")).to_contain_text(f"Job {job.pk} discarded")
    expect(ui.page.locator(f"#job-{job.pk}")).to_have_count(0)
    assert not Job.objects.filter(pk=job.pk).exists()
    assert ui.same_document()


def test_throughput_chart_on_the_summary(ui, staff, workers):
    for _ in range(3):
        jobs.enqueue("durable.noop", {"units": 1})
    workers.start("--operation", "durable.noop", burst=True).wait(timeout=60)
    ui.login("admin")
    expect(ui.page.locator("svg.throughput rect.tp-completed")).to_have_count(1)
    expect(ui.page.locator("#throughput h2")).to_contain_text("3 completed")
    ui.page.select_option("#throughput select[name=range]", "week")
    ui.page.locator("#throughput").get_by_role("button", name="Show").click()
    expect(ui.page).to_have_url(re.compile(r"range=week"))
    expect(ui.page.locator("#throughput h2")).to_contain_text("per hour, last 7 days")


@pytest.mark.parametrize(("scheme", "dark"), [("dark", True), ("light", False)])
def test_theme_follows_the_browser_preference(ui, staff, scheme, dark):
    ui.page.emulate_media(color_scheme=scheme)
    ui.login("admin", next_path="/problems/jobs/")
    background = ui.page.evaluate("getComputedStyle(document.body).backgroundColor")
    red, green, blue = (int(n) for n in re.findall(r"\d+", background)[:3])
    assert (red + green + blue < 200) is dark, background
    ui.shot(f"jobs-{scheme}")
