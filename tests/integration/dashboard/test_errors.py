"""Error replies of the dashboard: a refused CSRF check, a page that is not there, and a job
purged while its page polls — each in the dashboard's words, with its headers, and to htmx
as a message rather than a whole document."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from durable.models import Job
from recovery.dashboard.access import CSRF_MESSAGE
from recovery.models import SecurityEvent

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true"}
INLINE_STYLE = re.compile(r"<style|\sstyle\s*=")


def assert_dashboard_headers(response) -> None:
    assert "HX-Request" in response["Vary"]
    assert "no-store" in response["Cache-Control"]


def test_csrf__htmx_gets_the_message_fragment_not_djangos_page(client_for, make_job):
    job = make_job("running")
    client = client_for("admin", enforce_csrf_checks=True)
    response = client.post(reverse("problems:job-action", args=[job.pk, "pause"]), headers=HTMX)
    html = response.content.decode()
    assert response.status_code == 403
    assert html.lstrip().startswith('<p class="msg msg-error"')  # swapped into #messages
    assert "security token is missing or out of date" in html
    assert "<html" not in html
    assert not INLINE_STYLE.search(html)  # Django's csrf_403.html has a <style>: a CSP error
    assert_dashboard_headers(response)
    assert Job.objects.get(pk=job.pk).state == "running"
    row = SecurityEvent.objects.get(category="dashboard", key="csrf-failed")
    assert (row.count, row.users, row.cwe) == (1, {"admin": 1}, "CWE-352")


def test_csrf__a_plain_post_gets_a_page_without_inline_style(client_for, make_job):
    job = make_job("running")
    client = client_for("admin", enforce_csrf_checks=True)
    response = client.post(reverse("problems:job-action", args=[job.pk, "cancel"]))
    html = response.content.decode()
    assert response.status_code == 403
    assert html.startswith("<!doctype html>")
    assert CSRF_MESSAGE in html.replace("&#x27;", "'")
    assert 'href="/problems/"' in html
    assert not INLINE_STYLE.search(html)
    assert_dashboard_headers(response)


def test_csrf__the_login_form_too():
    response = Client(enforce_csrf_checks=True).post(
        reverse("problems:login"), {"username": "a", "password": "b"}
    )
    assert response.status_code == 403
    assert not INLINE_STYLE.search(response.content.decode())


@pytest.mark.parametrize("htmx", [False, True], ids=["page", "htmx"])
def test_not_found__inside_the_dashboard_keeps_its_headers(client_for, make_job, htmx):
    job = make_job("running")
    client = client_for("admin")
    headers = HTMX if htmx else {}
    missing = client.get(reverse("problems:job", args=[424242]))  # (htmx: see the 286 below)
    action = client.post(reverse("problems:job-action", args=[job.pk, "explode"]), headers=headers)
    for response in (missing, action):
        assert response.status_code == 404
        assert_dashboard_headers(response)
        assert not INLINE_STYLE.search(response.content.decode())
    assert "Job 424242 does not exist" in missing.content.decode()
    text = action.content.decode()
    assert "There is no action &#x27;explode&#x27;" in text
    assert text.lstrip().startswith("<p class") == htmx


def test_purged_job__its_open_page_stops_polling_with_286_and_a_message(client_for, make_job):
    job = make_job("queued")
    client = client_for("admin")
    detail = reverse("problems:job", args=[job.pk])
    assert 'data-polling="2s"' in client.get(detail).content.decode()
    Job.objects.filter(pk=job.pk).delete()  # what retention does to a finished job
    poll = client.get(detail, headers={**HTMX, "HX-Trigger": "job-detail"})
    html = poll.content.decode()
    assert poll.status_code == 286  # htmx: stop polling
    assert html.lstrip().startswith('<section id="job-detail"')
    assert "hx-trigger" not in html
    assert f"Job {job.pk} does not exist" in html
    assert 'id="messages"' in html  # and the message area says so too
    assert_dashboard_headers(poll)
