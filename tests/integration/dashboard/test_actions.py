"""Actions from the dashboard: every transition, idempotency, refusals as messages, the audit
trail (who, from where, what, on which jobs, done), bulk actions and "New job"."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.test import override_settings
from django.urls import reverse

from durable import jobs as jobs_module
from durable.models import Job, JobEvent
from recovery.dashboard import bulk as bulk_module
from recovery.models import RecoveryEvent
from tests.integration.helpers import drain

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true"}


@pytest.fixture
def admin(client_for):
    return client_for("admin")


def act(client, job, action, **extra):
    return client.post(reverse("problems:job-action", args=[job.pk, action]), **extra)


def messages_of(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


# state before -> action -> state after (through the engine's own table)
TRANSITIONS = [
    ("queued", "pause", "paused"),
    ("running", "pause", "paused"),
    ("paused", "resume", "queued"),
    ("queued", "cancel", "cancelled"),
    ("running", "cancel", "cancelling"),
    ("paused", "cancel", "cancelled"),
    ("failed", "retry", "queued"),
]


@pytest.mark.parametrize(("before", "action", "after"), TRANSITIONS)
def test_action__applies_and_is_audited(admin, make_job, before, action, after):
    job = make_job(before)
    response = act(admin, job, action, REMOTE_ADDR="192.0.2.44")
    assert response.status_code == 302
    assert response["Location"] == reverse("problems:job", args=[job.pk])
    assert Job.objects.get(pk=job.pk).state == after
    assert any(f"Job {job.pk}" in text and "now" in text for text in messages_of(response))
    audit = RecoveryEvent.objects.get(type="job-action")
    assert audit.done is True
    assert (audit.username, audit.user_id) == ("admin", str(response.wsgi_request.user.pk))
    assert audit.ipv4 == "192.0.2.44"
    assert audit.object_ids == [str(job.pk)]
    assert audit.job_id == job.pk
    assert audit.source == "dashboard"
    # the job's own log names the actor too
    assert JobEvent.objects.filter(job=job, data__actor="admin").exists()


def test_action__twice_is_harmless(admin, make_job):
    job = make_job("running")
    act(admin, job, "pause")
    seq = Job.objects.get(pk=job.pk).event_seq
    second = act(admin, job, "pause", follow=True)
    assert Job.objects.get(pk=job.pk).event_seq == seq  # no second event
    assert f"Job {job.pk} is already paused: nothing to do." in second.content.decode()
    assert RecoveryEvent.objects.filter(type="job-action", done=True).count() == 2


@pytest.mark.parametrize(
    ("state", "action"),
    [("completed", "pause"), ("completed", "cancel"), ("cancelled", "resume"),
     ("completed", "retry"), ("failed", "pause")],
)  # fmt: skip
def test_action__a_refused_transition_is_a_message_not_a_500(admin, make_job, state, action):
    job = make_job(state)
    response = act(admin, job, action, follow=True)
    assert response.status_code == 200
    assert f"Job {job.pk}: not " in response.content.decode()
    assert "cannot be" in response.content.decode()
    assert Job.objects.get(pk=job.pk).state == state
    audit = RecoveryEvent.objects.get(type="job-action")
    assert audit.done is False
    assert "cannot be" in audit.reason


def test_action__on_a_job_that_does_not_exist(admin):
    response = admin.post(reverse("problems:job-action", args=[424242, "cancel"]), follow=True)
    assert response.status_code == 200
    assert "no such job" in response.content.decode()
    htmx = admin.post(reverse("problems:job-action", args=[424242, "cancel"]), headers=HTMX)
    assert htmx.status_code == 200
    assert 'hx-swap-oob="true"' in htmx.content.decode()


def test_action__htmx_gets_the_updated_row_and_the_message(admin, make_job):
    job = make_job("running")
    response = act(admin, job, "pause", headers=HTMX)
    html = response.content.decode()
    assert html.lstrip().startswith(f'<tr id="job-{job.pk}"')
    assert "badge state-paused" in html
    assert "act-resume" in html
    assert "act-pause" not in html
    assert '<div id="messages"' in html
    assert 'hx-swap-oob="true"' in html
    assert f"Job {job.pk} paused" in html
    assert "HX-Request" in response["Vary"]


def test_action__htmx_from_the_detail_page_gets_the_detail(admin, make_job):
    job = make_job("failed")
    response = act(admin, job, "retry", data={"render": "detail"}, headers=HTMX)
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="job-detail"')
    assert "badge big state-queued" in html
    assert 'hx-trigger="every 2s"' in html  # queued again: the detail polls


@pytest.mark.parametrize(
    ("state", "action"),
    [("paused", "resume"), ("running", "cancel"), ("failed", "retry"), ("running", "pause")],
)
def test_action__the_detail_it_answers_polls_the_job_not_the_action(admin, make_job, state, action):
    job = make_job(state)
    response = act(admin, job, action, data={"render": "detail"}, headers=HTMX)
    html = response.content.decode()
    detail = reverse("problems:job", args=[job.pk])
    section = html.split(">", 1)[0]
    if Job.objects.get(pk=job.pk).state in ("queued", "running", "cancelling"):
        assert f'hx-get="{detail}"' in section  # a GET of the action URL would be a 405
    assert f"/{action}/" not in section
    assert set(re.findall(r'name="next" value="([^"]*)"', html)) <= {detail}
    assert admin.get(detail, headers=HTMX).status_code == 200


def test_job_detail__earlier_events_and_its_poll_keep_their_place(admin, make_job):
    job = make_job("running")
    for n in range(210):
        jobs_module.pause(job.pk) if n % 2 == 0 else jobs_module.resume(job.pk)
    detail = reverse("problems:job", args=[job.pk])
    older = admin.get(detail, {"upto": "5"}).content.decode()
    assert f'hx-get="{detail}?upto=5"' in older
    latest = admin.get(detail).content.decode()
    assert f'hx-get="{detail}"' in latest
    seq = Job.objects.get(pk=job.pk).event_seq
    assert f'href="{detail}?upto={seq - 200}"' in latest  # "Earlier events"


def test_action__refused_by_htmx_keeps_the_row_and_says_why(admin, make_job):
    job = make_job("completed")
    html = act(admin, job, "cancel", headers=HTMX).content.decode()
    assert "badge state-completed" in html
    assert "msg-error" in html
    assert "cannot be cancelled" in html


def test_action__goes_back_to_a_local_next_only(admin, make_job):
    job = make_job("running")
    back = act(admin, job, "pause", data={"next": "/problems/jobs/?state=running"})
    assert back["Location"] == "/problems/jobs/?state=running"
    job = make_job("running")
    away = act(admin, job, "pause", data={"next": "https://evil.example/problems/"})
    assert away["Location"] == reverse("problems:job", args=[job.pk])


@override_settings(TRUSTED_PROXY_COUNT=1)
def test_audit__behind_one_trusted_proxy_the_forwarded_address_counts(admin, make_job):
    job = make_job("running")
    act(admin, job, "cancel", REMOTE_ADDR="10.0.0.2",
        HTTP_X_FORWARDED_FOR="6.6.6.6, 2001:db8::77")  # fmt: skip
    audit = RecoveryEvent.objects.get(type="job-action")
    assert (audit.ipv4, audit.ipv6) == (None, "2001:db8::77")


def test_audit__without_trusted_proxies_the_header_is_ignored(admin, make_job):
    job = make_job("running")
    act(admin, job, "cancel", REMOTE_ADDR="192.0.2.9", HTTP_X_FORWARDED_FOR="6.6.6.6")
    assert RecoveryEvent.objects.get(type="job-action").ipv4 == "192.0.2.9"


def test_audit__shows_on_the_recovery_page_with_the_job_link(admin, make_job):
    job = make_job("running")
    act(admin, job, "pause", REMOTE_ADDR="192.0.2.9")
    html = admin.get(reverse("problems:recovery")).content.decode()
    assert "job-action" in html
    assert "192.0.2.9" in html
    assert f'href="/problems/jobs/{job.pk}/"' in html


# --- bulk: selected rows ------------------------------------------------------------------------


def test_bulk_selected__confirms_with_the_count_then_applies(admin, make_job):
    running = [make_job("running") for _ in range(3)]
    done = make_job("completed")
    ids = [j.pk for j in (*running, done)]
    data = {"action": "cancel", "scope": "selected", "ids": ids, "next": "/problems/jobs/"}
    confirm = admin.post(reverse("problems:bulk"), data)
    html = confirm.content.decode()
    assert confirm.status_code == 200
    assert "Cancel the <strong>4 jobs</strong> you selected?" in html
    assert re.search(r"running</span></td><td class=\"num\">3<", html)
    assert all(Job.objects.get(pk=j.pk).state == "running" for j in running)  # not yet
    applied = admin.post(reverse("problems:bulk"), {**data, "confirmed": "1"}, follow=True)
    assert [Job.objects.get(pk=i).state for i in ids] == ["cancelling"] * 3 + ["completed"]
    text = applied.content.decode()
    assert "3 cancelled, 1 refused (1 x a completed job cannot be cancelled)." in text
    audit = RecoveryEvent.objects.get(type="job-action")
    assert sorted(audit.object_ids, key=int) == [str(i) for i in ids]
    assert audit.done is False  # one was refused
    assert applied.redirect_chain[-1][0] == "/problems/jobs/"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"action": "pause", "scope": "selected"}, "No jobs selected"),
        ({"action": "pause", "scope": "selected", "ids": ["x"]}, "at most 100 jobs"),
        ({"action": "pause", "scope": "selected", "ids": [str(n) for n in range(1, 102)]},
         "at most 100 jobs"),
        ({"action": "explode", "scope": "selected", "ids": ["1"]}, "Choose an action"),
        ({"action": "pause", "scope": "everything"}, "Choose an action"),
    ],
)  # fmt: skip
def test_bulk__bad_forms_are_messages(admin, data, message):
    response = admin.post(reverse("problems:bulk"), data, follow=True)
    assert response.status_code == 200
    assert message in response.content.decode()


# --- bulk: everything matching a filter -------------------------------------------------


def test_bulk_filter__runs_as_a_durable_job_in_batches(admin, make_job, monkeypatch):
    monkeypatch.setattr(bulk_module, "BATCH_SIZE", 2)
    queued = [make_job("queued") for _ in range(5)]
    other = make_job("paused")
    data = {"action": "pause", "scope": "filter", "filter_state": "queued",
            "upto": str(max(j.pk for j in (*queued, other)))}  # fmt: skip
    confirm = admin.post(reverse("problems:bulk"), data).content.decode()
    assert "Pause <strong>5 jobs</strong>: every job matching state=queued, created up" in confirm
    late = make_job("queued")  # created after the confirmation: not touched
    response = admin.post(reverse("problems:bulk"), {**data, "confirmed": "1"})
    bulk_job = Job.objects.get(operation="recovery.bulk_action")
    assert response["Location"] == reverse("problems:job", args=[bulk_job.pk])
    assert bulk_job.owner == "admin"
    assert bulk_job.input["expected"] == 5
    assert RecoveryEvent.objects.get(type="job-bulk-action", job_id=bulk_job.pk).done is True
    drain(bulk_job.pk)
    bulk_job.refresh_from_db()
    assert bulk_job.state == "completed"
    assert (bulk_job.units_done, bulk_job.units_total) == (4, 4)  # 3 batches + the report
    assert [Job.objects.get(pk=j.pk).state for j in queued] == ["paused"] * 5
    assert Job.objects.get(pk=late.pk).state == "queued"
    assert Job.objects.get(pk=other.pk).state == "paused"
    summary = RecoveryEvent.objects.filter(type="job-bulk-action").order_by("-id").first()
    assert "5 applied, 0 already so, 0 refused" in summary.detail
    assert summary.done is True
    assert summary.username == "admin"
    page = admin.get(reverse("problems:job", args=[bulk_job.pk])).content.decode()
    assert 'max="4" value="4"' in page


def test_bulk_filter__a_confirmation_sent_twice_queues_one_job(admin, make_job):
    queued = [make_job("queued") for _ in range(3)]
    data = {"action": "pause", "scope": "filter", "filter_state": "queued",
            "upto": str(queued[-1].pk), "confirmed": "1"}  # fmt: skip
    first = admin.post(reverse("problems:bulk"), data)
    second = admin.post(reverse("problems:bulk"), data, follow=True)
    bulk_job = Job.objects.get(operation="recovery.bulk_action")
    assert first["Location"] == reverse("problems:job", args=[bulk_job.pk])
    assert second.redirect_chain[-1][0] == reverse("problems:job", args=[bulk_job.pk])
    assert f"Already queued as job {bulk_job.pk}" in second.content.decode()
    assert RecoveryEvent.objects.filter(type="job-bulk-action").count() == 1
    # Another action, filter or user is another job.
    admin.post(reverse("problems:bulk"), {**data, "action": "cancel"})
    admin.post(reverse("problems:bulk"), {**data, "filter_q": "noop"})
    client_for_other = admin.__class__()
    client_for_other.force_login(User.objects.create_superuser("other", "", "pw"))
    client_for_other.post(reverse("problems:bulk"), data)
    assert Job.objects.filter(operation="recovery.bulk_action").count() == 4


def test_bulk_filter__nothing_matching_enqueues_nothing(admin, make_job):
    make_job("paused")
    data = {"action": "resume", "scope": "filter", "filter_state": "failed", "confirmed": "1"}
    response = admin.post(reverse("problems:bulk"), data, follow=True)
    assert "nothing to do" in response.content.decode()
    assert not Job.objects.filter(operation="recovery.bulk_action").exists()


def test_bulk_filter__fails_without_touching_anything_if_the_owner_lost_the_right(
    client_for, make_user, make_job
):
    user = make_user("canceller", "carla")
    client = client_for("anonymous")
    client.force_login(user)
    victim = make_job("queued")
    data = {"action": "cancel", "scope": "filter", "confirmed": "1", "upto": str(victim.pk)}
    client.post(reverse("problems:bulk"), data)
    bulk_job = Job.objects.get(operation="recovery.bulk_action")
    user.user_permissions.clear()  # taken away before a worker picked the job up
    drain(bulk_job.pk)
    bulk_job.refresh_from_db()
    assert bulk_job.state == "failed"
    assert "may not cancel jobs" in bulk_job.reason
    assert Job.objects.get(pk=victim.pk).state == "queued"


def test_bulk_filter__cannot_be_started_from_new_job(client_for):
    client = client_for("admin")
    page = client.get(reverse("problems:new-job")).content.decode()
    assert "recovery.bulk_action" not in page
    response = client.post(
        reverse("problems:new-job"),
        {"operation": "recovery.bulk_action", "input-input": "{}"},
    )
    assert response.status_code == 403
    assert "recovery.bulk_action is started by the site itself" in response.content.decode()
    assert not Job.objects.exists()


# --- New job ----------------------------------------------------------------------------


def test_new_job__json_input_is_checked_by_the_engine(client_for):
    client = client_for("adder")
    url = reverse("problems:new-job")
    page = client.get(url, {"operation": "durable.noop"}).content.decode()
    assert 'name="input-input"' in page  # no input_form: a JSON field
    bad_json = client.post(url, {"operation": "durable.noop", "input-input": "{units: 3"})
    assert "Not valid JSON" in bad_json.content.decode()
    not_object = client.post(url, {"operation": "durable.noop", "input-input": "[1, 2]"})
    assert "must be a JSON object" in not_object.content.decode()
    refused = client.post(url, {"operation": "durable.noop", "input-input": '{"units": -1}'})
    html = refused.content.decode()
    assert refused.status_code == 200
    assert re.search(r'field-error" id="id_input-input-error">units: must be an integer', html)
    secret = client.post(url, {"operation": "durable.noop", "input-input": '{"password": "x"}'})
    assert "password" in secret.content.decode()
    assert not Job.objects.exists()
    created = client.post(
        url,
        {"operation": "durable.noop", "input-input": '{"units": 4}', "job-priority": "7",
         "job-on_restart": "retry"},
    )  # fmt: skip
    job = Job.objects.get()
    assert created["Location"] == reverse("problems:job", args=[job.pk])
    assert (job.input, job.priority, job.on_restart, job.owner) == (
        {"units": 4, "sleep": 0}, 7, "retry", "adder"
    )  # fmt: skip
    audit = RecoveryEvent.objects.get(type="job-created")
    assert (audit.job_id, audit.username, audit.done) == (job.pk, "adder", True)


def test_new_job__an_operations_input_form_and_its_errors(client_for):
    client = client_for("adder")
    url = reverse("problems:new-job")
    page = client.get(url, {"operation": "test.form"}).content.decode()
    for field in ("input-source", "input-copies", "input-not_before"):
        assert f'name="{field}"' in page
    assert 'name="input-input"' not in page
    form = {"operation": "test.form", "input-source": "a", "input-copies": "99"}
    invalid = client.post(url, form)
    assert "less than or equal to 10" in invalid.content.decode()
    refused = client.post(
        url, {"operation": "test.form", "input-source": "/etc/shadow", "input-copies": "1"}
    )
    html = refused.content.decode()
    assert re.search(r'id="id_input-source-error">that file is off limits<', html)
    assert not Job.objects.exists()
    client.post(
        url,
        {"operation": "test.form", "input-source": "/srv/a", "input-copies": "2",
         "input-not_before": "2026-12-24", "job-priority": "-101"},
    )  # fmt: skip
    assert not Job.objects.exists()  # priority out of range, shown on its field
    client.post(
        url,
        {"operation": "test.form", "input-source": "/srv/a", "input-copies": "2",
         "input-not_before": "2026-12-24"},
    )  # fmt: skip
    assert Job.objects.get().input == {"source": "/srv/a", "copies": 2, "not_before": "2026-12-24"}


def test_new_job__unknown_operation_is_a_message(client_for):
    response = client_for("adder").get(reverse("problems:new-job"), {"operation": "nope.<b>"})
    html = response.content.decode()
    assert response.status_code == 200
    assert "There is no operation named &#x27;nope.&lt;b&gt;&#x27;" in html
