"""Every dashboard URL for every kind of user: anonymous, not staff, read-only staff, and
operators holding exactly one permission."""

from __future__ import annotations

import pytest
from django.urls import reverse

from durable.models import Job
from recovery.models import SecurityEvent

pytestmark = pytest.mark.django_db

PAGES = ["summary", "recovery", "security", "jobs", "job", "new-job", "record-event"]
ACTIONS = ["pause", "resume", "cancel", "retry"]
# Which role may do what (True: allowed). Superusers and change_job holders may do all.
MAY_ACT = {
    "readonly": set(),
    "pauser": {"pause", "resume"},
    "canceller": {"cancel"},
    "retrier": {"retry"},
    "adder": set(),
    "changer": set(ACTIONS),
    "admin": set(ACTIONS),
}
MAY_ADD = {"adder", "admin"}
STAFF_ROLES = list(MAY_ACT)


def page_url(name: str, job: Job) -> str:
    if name == "job":
        return reverse("problems:job", args=[job.pk])
    return reverse(f"problems:{name}")


@pytest.mark.parametrize("name", PAGES)
def test_anonymous__every_page_redirects_to_login(client_for, make_job, name):
    url = page_url(name, make_job("queued"))
    response = client_for("anonymous").get(url)
    assert response.status_code == 302
    assert response["Location"] == f"{reverse('problems:login')}?next={url}"


@pytest.mark.parametrize("name", PAGES)
def test_anonymous__htmx_requests_redirect_the_whole_page(client_for, make_job, name):
    url = page_url(name, make_job("queued"))
    response = client_for("anonymous").get(
        url, headers={"HX-Request": "true", "HX-Current-URL": f"http://testserver{url}?q=x"}
    )
    assert response.status_code == 200
    assert response["HX-Redirect"] == f"{reverse('problems:login')}?next={url}%3Fq%3Dx"


@pytest.mark.parametrize("action", ACTIONS)
def test_anonymous__actions_redirect_to_login_and_change_nothing(client_for, make_job, action):
    job = make_job("running" if action != "resume" else "paused")
    response = client_for("anonymous").post(reverse("problems:job-action", args=[job.pk, action]))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("problems:login"))
    assert Job.objects.get(pk=job.pk).state == job.state


def test_anonymous__bulk_and_new_job_redirect_to_login(client_for, make_job):
    job = make_job("queued")
    client = client_for("anonymous")
    bulk = client.post(
        reverse("problems:bulk"),
        {"action": "cancel", "scope": "selected", "ids": [job.pk], "confirmed": "1"},
    )
    new = client.post(reverse("problems:new-job"), {"operation": "durable.noop"})
    assert bulk.status_code == new.status_code == 302
    assert Job.objects.get(pk=job.pk).state == "queued"
    assert Job.objects.count() == 1


@pytest.mark.parametrize("name", PAGES)
def test_not_staff__every_page_is_forbidden_and_counted(client_for, make_job, name):
    url = page_url(name, make_job("queued"))
    response = client_for("nonstaff").get(url)
    assert response.status_code == 403
    assert b"staff users only" in response.content
    row = SecurityEvent.objects.get(category="dashboard", key="not-staff")
    assert row.count == 1
    assert row.users == {"nonstaff": 1}


@pytest.mark.parametrize("action", ACTIONS)
def test_not_staff__actions_are_forbidden_even_with_permissions(client_for, make_job, action):
    job = make_job("running" if action != "resume" else "paused")
    response = client_for("nonstaff").post(reverse("problems:job-action", args=[job.pk, action]))
    assert response.status_code == 403
    assert Job.objects.get(pk=job.pk).state == job.state


@pytest.mark.parametrize("role", STAFF_ROLES)
@pytest.mark.parametrize("name", PAGES)
def test_staff__may_look_at_every_page_but_new_job_needs_add(client_for, make_job, role, name):
    response = client_for(role).get(page_url(name, make_job("queued")))
    if name == "new-job":
        expected = 200 if role in MAY_ADD else 403
    elif name == "record-event":  # recovery.add_recoveryevent, which only the superuser has here
        expected = 200 if role == "admin" else 403
    else:
        expected = 200
    assert response.status_code == expected


# state a job must be in for the action to apply
ACTION_STATE = {"pause": "running", "resume": "paused", "cancel": "running", "retry": "failed"}
AFTER = {"pause": "paused", "resume": "queued", "cancel": "cancelling", "retry": "queued"}


@pytest.mark.parametrize("role", STAFF_ROLES)
@pytest.mark.parametrize("action", ACTIONS)
def test_staff__actions_need_their_permission(client_for, make_job, role, action):
    job = make_job(ACTION_STATE[action])
    response = client_for(role).post(reverse("problems:job-action", args=[job.pk, action]))
    job.refresh_from_db()
    if action in MAY_ACT[role]:
        assert response.status_code == 302
        assert job.state == AFTER[action]
    else:
        assert response.status_code == 403
        assert job.state == ACTION_STATE[action]
        row = SecurityEvent.objects.get(category="dashboard", key=f"no-permission:{action}")
        assert row.users == {role: 1}


@pytest.mark.parametrize("role", STAFF_ROLES)
def test_staff__bulk_needs_the_actions_permission(client_for, make_job, role):
    job = make_job("running")
    response = client_for(role).post(
        reverse("problems:bulk"),
        {"action": "cancel", "scope": "selected", "ids": [job.pk], "confirmed": "1"},
    )
    job.refresh_from_db()
    if "cancel" in MAY_ACT[role]:
        assert response.status_code == 302
        assert job.state == "cancelling"
    else:
        assert response.status_code == 403
        assert job.state == "running"


@pytest.mark.parametrize("role", STAFF_ROLES)
def test_staff__new_job_needs_add_job(client_for, role):
    response = client_for(role).post(
        reverse("problems:new-job"),
        {"operation": "durable.noop", "input-input": '{"units": 2}'},
    )
    if role in MAY_ADD:
        assert response.status_code == 302
        assert Job.objects.get().input == {"units": 2, "sleep": 0}
    else:
        assert response.status_code == 403
        assert not Job.objects.exists()


@pytest.mark.parametrize("role", STAFF_ROLES)
def test_buttons__only_for_permitted_actions(client_for, make_job, role):
    make_job("running")
    make_job("failed")
    html = client_for(role).get(reverse("problems:jobs")).content.decode()
    for action in ACTIONS:
        offered = f"act-{action}" in html
        # a running job offers pause and cancel, a failed one retry; resume needs a paused job
        expected = action in MAY_ACT[role] and action != "resume"
        assert offered == expected, (role, action)
    assert ('name="scope"' in html) == bool(MAY_ACT[role])  # the bulk bar
    assert ("New job" in html) == (role in MAY_ADD)


def test_actions__get_is_not_allowed(client_for, make_job):
    job = make_job("running")
    response = client_for("admin").get(reverse("problems:job-action", args=[job.pk, "pause"]))
    assert response.status_code == 405
    assert Job.objects.get(pk=job.pk).state == "running"


def test_actions__unknown_action_or_huge_id_is_404_not_500(client_for, make_job):
    job = make_job("running")
    client = client_for("admin")
    assert client.post(reverse("problems:job-action", args=[job.pk, "explode"])).status_code == 404
    assert client.post(f"/problems/jobs/{10**30}/pause/").status_code == 404
    assert client.get(f"/problems/jobs/{10**30}/").status_code == 404
    assert client.get("/problems/jobs/999999999/").status_code == 404


def test_csrf__a_forged_post_is_refused(client_for, make_job):
    job = make_job("running")
    client = client_for("admin", enforce_csrf_checks=True)
    response = client.post(reverse("problems:job-action", args=[job.pk, "cancel"]))
    assert response.status_code == 403
    assert Job.objects.get(pk=job.pk).state == "running"


def test_csrf__htmx_sends_the_token_from_the_page(client_for, make_job):
    job = make_job("running")
    client = client_for("admin", enforce_csrf_checks=True)
    page = client.get(reverse("problems:jobs")).content.decode()
    token = page.split('"X-CSRFToken": "', 1)[1].split('"', 1)[0]
    response = client.post(
        reverse("problems:job-action", args=[job.pk, "cancel"]),
        headers={"HX-Request": "true", "X-CSRFToken": token},
    )
    assert response.status_code == 200
    assert Job.objects.get(pk=job.pk).state == "cancelling"


def test_login__wrong_password_is_counted_in_security(client):
    response = client.post(
        reverse("problems:login"),
        {"username": "mallory", "password": "guess"},
        REMOTE_ADDR="203.0.113.66",
    )
    assert response.status_code == 200  # the form again, with its error
    assert b"correct username and password" in response.content
    row = SecurityEvent.objects.get(category="dashboard-login")
    assert (row.count, row.users, row.addresses) == (1, {"mallory": 1}, {"203.0.113.66": 1})


def test_login__staff_lands_on_the_summary(client, make_user):
    make_user("readonly", "rita")
    response = client.post(reverse("problems:login"), {"username": "rita", "password": "pw"})
    assert response.status_code == 302
    assert response["Location"] == reverse("problems:summary")


def test_login__next_is_followed_only_within_the_site(client, make_user):
    make_user("readonly", "rita")
    inside = client.post(
        reverse("problems:login") + "?next=/problems/jobs/",
        {"username": "rita", "password": "pw", "next": "/problems/jobs/"},
    )
    assert inside["Location"] == "/problems/jobs/"
    client.logout()
    outside = client.post(
        reverse("problems:login"),
        {"username": "rita", "password": "pw", "next": "https://evil.example/"},
    )
    assert outside["Location"] == reverse("problems:summary")


def test_logout__needs_post_and_ends_the_session(client_for):
    client = client_for("readonly")
    assert client.get(reverse("problems:logout")).status_code == 405
    assert client.post(reverse("problems:logout")).status_code == 302
    assert client.get(reverse("problems:summary")).status_code == 302
