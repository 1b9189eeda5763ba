"""No click or filter change is lost while a table request is in flight.

The network is slowed with Playwright route delays (the handler waits before letting
the request through), so a click reliably lands inside a refresh's round trip — what
a user at 150 ms latency meets on every poll. Each test waits until the slow request
has left the browser, acts, and then requires the page, the address bar and the
database to agree with what the user did last.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest

from durable import jobs
from durable.models import Job
from recovery.records import record_event
from tests.conftest import wait_until

try:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import expect
except ImportError:  # the chromium fixture skips (or fails under CI) first
    expect = None
    PlaywrightError = Exception

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

DELAY_MS = 1500  # far beyond the 150 ms that loses clicks, so the race is certain


def slow_down(ui, path: str, *, method: str = "GET", delay_ms: int = DELAY_MS) -> list[str]:
    """Delay htmx requests to ``path`` by ``delay_ms``; returns the list of their URLs."""
    seen: list[str] = []

    def handler(route) -> None:
        request = route.request
        if (
            request.method == method
            and urlsplit(request.url).path == path
            and request.headers.get("hx-request") == "true"
        ):
            seen.append(request.url)
            try:
                ui.page.wait_for_timeout(delay_ms)  # yields to Playwright: the test goes on
                route.continue_()
            except PlaywrightError:  # the test ended (the page closed) while it was held
                pass
            return
        route.continue_()

    ui.page.route(re.compile(re.escape(ui.url(path)) + r"(\?.*)?$"), handler)
    return seen


def is_refresh(ui, path: str):
    def check(request) -> bool:
        return (
            request.method == "GET"
            and urlsplit(request.url).path == path
            and request.headers.get("hx-request") == "true"
            and request.headers.get("hx-trigger") == "results"
        )

    return check


def test_pause_clicked_while_the_table_refreshes__is_sent_and_answered(ui, staff):
    job = jobs.enqueue("durable.noop", {"units": 3})  # queued, due, no worker: the table polls
    other = jobs.enqueue("durable.noop", {"units": 3})
    ui.login("admin", next_path="/problems/jobs/")
    expect(ui.page.locator("#results")).to_have_attribute("data-polling", "2s")
    ui.mark()
    slow_down(ui, "/problems/jobs/")
    posts: list[str] = []
    ui.page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    with ui.page.expect_request(is_refresh(ui, "/problems/jobs/"), timeout=5000):
        pass  # the next poll has left the browser and is held for DELAY_MS
    ui.page.locator(f"#job-{job.pk} button.act-pause").click()
    ui.page.locator(f"#job-{other.pk} button.act-cancel").click()  # a second click, too
    expect(ui.page.locator("#messages")).to_contain_text(re.compile(rf"Job ({job.pk}|{other.pk})"))
    wait_until(lambda: Job.objects.get(pk=job.pk).state == "paused", timeout=10)
    wait_until(lambda: Job.objects.get(pk=other.pk).state == "cancelled", timeout=10)
    assert len(posts) == 2, posts
    # the table ends showing both, whatever order the replies and refreshes came in
    expect(ui.page.locator(f"#job-{job.pk} .badge")).to_have_text("Paused")
    expect(ui.page.locator(f"#job-{other.pk} .badge")).to_have_text("Cancelled")
    assert ui.same_document()


def test_pause_clicked_while_the_table_refreshes__message_shows(ui, staff):
    job = jobs.enqueue("durable.noop", {"units": 3})
    ui.login("admin", next_path="/problems/jobs/")
    expect(ui.page.locator("#results")).to_have_attribute("data-polling", "2s")
    slow_down(ui, "/problems/jobs/")
    with ui.page.expect_request(is_refresh(ui, "/problems/jobs/"), timeout=5000):
        pass
    ui.page.locator(f"#job-{job.pk} button.act-pause").click()
    expect(ui.page.locator("#messages")).to_contain_text(f"Job {job.pk} paused")
    expect(ui.page.locator(f"#job-{job.pk} .badge")).to_have_text("Paused")
    assert Job.objects.get(pk=job.pk).state == "paused"


def test_recovery__failed_clicked_while_a_search_loads__both_apply(ui, staff):
    for n in range(12):
        record_event("backup-created", detail=f"Backed up wekan-{n}.sqlite")
    for n in range(3):
        record_event("corruption-detected", done=n != 1, detail=f"rare-needle.{n}")
    ui.login("admin", next_path="/problems/recovery/")
    ui.mark()
    sent = slow_down(ui, "/problems/recovery/")
    with ui.page.expect_request(lambda r: "q=rare-needle" in r.url, timeout=5000):
        ui.page.fill("input[name=q]", "rare-needle")
    ui.page.locator("label.seg-failed").click()  # while the search is held
    expect(ui.page).to_have_url(ui.url("/problems/recovery/?q=rare-needle&status=failed"))
    expect(ui.page.locator(".results .total")).to_contain_text("1 event matching")
    rows = ui.page.locator("table.recovery tbody tr:not(.empty)")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("rare-needle.1")
    expect(ui.page.locator("label.seg-failed input")).to_be_checked()
    ui.page.wait_for_timeout(DELAY_MS + 500)  # nothing older lands afterwards
    expect(ui.page.locator(".results .total")).to_contain_text("1 event matching")
    expect(ui.page).to_have_url(ui.url("/problems/recovery/?q=rare-needle&status=failed"))
    assert any("status=failed" in url for url in sent), sent
    assert ui.same_document()


def test_jobs__operation_chosen_while_a_state_filter_loads__both_apply(ui, staff):
    jobs.enqueue("durable.noop", {"units": 1})
    flaky = jobs.enqueue("test.flaky", {"fail_times": 0})
    paused = jobs.enqueue("durable.noop", {"units": 1})
    jobs.pause(paused.pk, actor="admin")
    jobs.pause(flaky.pk, actor="admin")
    ui.login("admin", next_path="/problems/jobs/")
    ui.mark()
    slow_down(ui, "/problems/jobs/")
    with ui.page.expect_request(lambda r: "state=paused" in r.url, timeout=5000):
        ui.page.select_option("select[name=state]", "paused")
    ui.page.select_option("select[name=operation]", "test.flaky")
    expect(ui.page).to_have_url(ui.url("/problems/jobs/?state=paused&operation=test.flaky"))
    rows = ui.page.locator("table.jobs tbody tr.job")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_id(f"job-{flaky.pk}")
    ui.page.wait_for_timeout(DELAY_MS + 500)
    expect(rows).to_have_count(1)
    expect(ui.page).to_have_url(ui.url("/problems/jobs/?state=paused&operation=test.flaky"))
    assert ui.same_document()
