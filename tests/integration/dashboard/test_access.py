"""Who may do what: every URL of the ``problems`` namespace x GET/POST x every kind of user
(generated: a URL added without its row in ``EXPECTED`` fails here), and operators holding
exactly one permission."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.urls import get_resolver, reverse

from durable.models import Job
from durable.schedules.models import Schedule
from durable.schedules.service import add_schedule
from recovery.models import RecoveryEvent, SecurityEvent

pytestmark = pytest.mark.django_db

LOGIN = "login"  # expected: a redirect to the login page
GENERATED_ROLES = ("anonymous", "nonstaff", "readonly", "operator")
ACTIONS = ["pause", "resume", "cancel", "retry"]


def namespace_urls() -> list[str]:
    """The names of every URL under /problems/, read from the URL configuration itself."""
    return [pattern.name for pattern in get_resolver().namespace_dict["problems"][1].url_patterns]


# url name -> (reverse args from the test's job, POST body, {(method, role): status}).
# Roles: anonymous, nonstaff (holds every permission, is not staff), readonly (the view
# permissions only), operator (every permission one by one, not a superuser).
def _pages(get_ok: int = 200) -> dict[tuple[str, str], Any]:
    return {("GET", "anonymous"): LOGIN, ("GET", "nonstaff"): 403, ("GET", "readonly"): get_ok,
            ("GET", "operator"): 200, ("POST", "anonymous"): LOGIN, ("POST", "nonstaff"): 403,
            ("POST", "readonly"): 405, ("POST", "operator"): 405}  # fmt: skip


def _forms() -> dict[tuple[str, str], Any]:  # a form page that needs a permission of its own
    return {**_pages(get_ok=403), ("POST", "readonly"): 403, ("POST", "operator"): 302}


def _posts(done: int = 302) -> dict[tuple[str, str], Any]:  # POST-only endpoints
    return {("GET", "anonymous"): LOGIN, ("GET", "nonstaff"): 403, ("GET", "readonly"): 405,
            ("GET", "operator"): 405, ("POST", "anonymous"): LOGIN, ("POST", "nonstaff"): 403,
            ("POST", "readonly"): 403, ("POST", "operator"): done}  # fmt: skip


def _open(get: int, post: int) -> dict[tuple[str, str], Any]:  # login/logout: everyone
    return {(method, role): (get if method == "GET" else post)
            for method in ("GET", "POST") for role in GENERATED_ROLES}  # fmt: skip


@dataclass
class Made:
    job: Job
    schedule: Schedule


def _job(made: Made) -> list[Any]:
    return [made.job.pk]


def _none(made: Made) -> list[Any]:
    return []


EXPECTED: dict[str, tuple[Callable[[Made], list[Any]], dict[str, Any], dict]] = {
    "summary": (_none, {}, _pages()),
    "recovery": (_none, {}, _pages()),
    "security": (_none, {}, _pages()),
    "jobs": (_none, {}, _pages()),
    "job": (_job, {}, _pages()),
    "new-job": (
        _none,
        {"operation": "durable.noop", "input-input": '{"units": 2}'},
        _forms(),
    ),
    "record-event": (
        _none,
        {"type": "restore-backup", "severity": "info", "outcome": "done", "detail": "by hand"},
        _forms(),
    ),
    "bulk": (
        _none,
        {"action": "cancel", "scope": "selected", "ids": ["{job}"], "confirmed": "1"},
        _posts(),
    ),
    "job-action": (lambda made: [made.job.pk, "cancel"], {}, _posts()),
    "schedules": (_none, {}, _pages()),
    "queues": (_none, {}, _pages()),
    "workers": (_none, {}, _pages()),
    # pause_queue is not among the operator's rights (conftest.EVERY_RIGHT): its own permission
    "queue-change": (
        lambda made: ["pause"],
        {"queue": "default"},
        {**_posts(), ("POST", "operator"): 403},
    ),
    "new-schedule": (
        _none,
        {
            "operation": "durable.noop",
            "input-input": "{}",
            "schedule-name": "every-hour",
            "schedule-timing": "interval",
            "schedule-every": "1h",
            "schedule-catch_up": "latest",
            "schedule-enabled": "on",
        },
        _forms(),
    ),
    "schedule-change": (lambda made: [made.schedule.pk, "disable"], {}, _posts()),
    "login": (_none, {"username": "nobody", "password": "wrong"}, _open(200, 200)),
    "logout": (_none, {}, _open(405, 302)),
}


def test_every_url_of_the_namespace_has_its_expectations():
    assert sorted(namespace_urls()) == sorted(EXPECTED)


def effects() -> tuple:
    """What a refused request must leave as it was."""
    jobs = tuple(Job.objects.order_by("pk").values_list("pk", "state"))
    schedules = tuple(Schedule.objects.order_by("pk").values_list("name", "enabled"))
    return jobs, schedules, RecoveryEvent.objects.count()


CASES = [
    pytest.param(name, method, role, id=f"{name}-{method}-{role}")
    for name in namespace_urls()
    for method in ("GET", "POST")
    for role in GENERATED_ROLES
]


@pytest.mark.parametrize(("name", "method", "role"), CASES)
def test_access__every_url_every_method_every_role(client_for, make_job, name, method, role):
    job = make_job("running")
    made = Made(job, add_schedule("nightly", "durable.noop", every=timedelta(hours=1)))
    args, body, expected = EXPECTED[name]
    url = reverse(f"problems:{name}", args=args(made))
    data = {key: [str(job.pk)] if value == ["{job}"] else value for key, value in body.items()}
    client = client_for(role)
    before = effects()
    response = client.get(url) if method == "GET" else client.post(url, data)
    want = expected[(method, role)]
    if want == LOGIN:
        assert response.status_code == 302
        assert response["Location"] == f"{reverse('problems:login')}?next={url}"
    else:
        assert response.status_code == want, response.content[:300]
    if want in (LOGIN, 403, 405):
        assert effects() == before  # refused: nothing changed, no job, no event
    if want == 403:
        assert SecurityEvent.objects.filter(category="dashboard").exists()  # counted
    if role != "anonymous" and name not in ("login", "logout"):
        assert "HX-Request" in response["Vary"]
        assert "no-store" in response["Cache-Control"]


def test_not_staff__refusals_are_counted_by_user(client_for, make_job):
    job = make_job("queued")
    client = client_for("nonstaff")
    client.get(reverse("problems:jobs"))
    client.post(reverse("problems:bulk"), {"action": "cancel", "scope": "filter",
                                           "upto": str(job.pk), "confirmed": "1"})  # fmt: skip
    client.post(reverse("problems:new-job"), {"operation": "durable.noop"})
    client.post(reverse("problems:record-event"), {"type": "t", "detail": "x"})
    row = SecurityEvent.objects.get(category="dashboard", key="not-staff")
    assert (row.count, row.users) == (4, {"nonstaff": 4})
    assert list(Job.objects.values_list("pk", flat=True)) == [job.pk]  # no bulk job either
    assert not RecoveryEvent.objects.filter(type="t").exists()


@pytest.mark.parametrize("state", ["queued", "running", "paused", "failed"])
def test_readonly__the_job_page_offers_no_button(client_for, make_job, state):
    job = make_job(state)
    html = client_for("readonly").get(reverse("problems:job", args=[job.pk])).content.decode()
    assert "act-" not in html
    assert f"/problems/jobs/{job.pk}/" + "pause/" not in html
    assert '<form method="post" action="/problems/jobs/' not in html
    admin = client_for("admin").get(reverse("problems:job", args=[job.pk])).content.decode()
    assert "act-" in admin  # the same page with the rights has them


# Views: a staff user sees what their view permissions allow, on the pages and the Summary.
VIEWS = {
    "recovery": "recovery.view_recoveryevent",
    "security": "recovery.view_securityevent",
    "jobs": "durable.view_job",
}


@pytest.mark.parametrize("area", list(VIEWS))
def test_view_permissions__each_opens_its_page_and_its_summary_section(make_user, make_job, area):
    from django.contrib.auth.models import Permission
    from django.test import Client

    job = make_job("running")
    user = make_user("noview", f"only-{area}")
    app_label, codename = VIEWS[area].split(".")
    user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label,
                                                     codename=codename))  # fmt: skip
    client = Client()
    client.force_login(user)
    pages = {"recovery": reverse("problems:recovery"), "security": reverse("problems:security"),
             "jobs": reverse("problems:jobs")}  # fmt: skip
    for other, url in pages.items():
        assert client.get(url).status_code == (200 if other == area else 403), other
    detail = client.get(reverse("problems:job", args=[job.pk]))
    assert detail.status_code == (200 if area == "jobs" else 403)
    summary = client.get(reverse("problems:summary")).content.decode()
    sections = {
        "jobs": "Jobs in progress",
        "recovery": "Recovery events per day",
        "security": "Top security rows",
    }
    for other, heading in sections.items():
        assert (heading in summary) == (other == area), other
    menu = summary.split('<nav class="menu"', 1)[1].split("</nav>", 1)[0]
    for other, url in pages.items():
        assert (f'href="{url}"' in menu) == (other == area), other
    key = f"no-permission:view-{'recovery' if area != 'recovery' else 'security'}"
    assert SecurityEvent.objects.filter(category="dashboard", key=key).exists()


def test_view_permissions__none_gives_an_empty_summary_that_says_why(client_for):
    client = client_for("noview")
    summary = client.get(reverse("problems:summary"))
    assert summary.status_code == 200
    assert "may not view any report yet" in summary.content.decode()
    assert (
        client.get(reverse("problems:summary"), headers={"HX-Request": "true"}).status_code == 403
    )


def test_view_permissions__an_action_right_without_view_is_not_enough(client_for, make_job):
    job = make_job("failed")
    client = client_for("blindretrier")  # retry_job, but not view_job
    response = client.post(reverse("problems:job-action", args=[job.pk, "retry"]))
    assert response.status_code == 403
    assert Job.objects.get(pk=job.pk).state == "failed"


def test_view_permissions__job_page_shows_recovery_events_only_to_who_may_see_them(
    client_for, make_job
):
    from recovery.records import record_event

    job = make_job("running")
    record_event("job-reclaimed-after-restart", detail="seen-by-recovery-viewers", job_id=job.pk)
    url = reverse("problems:job", args=[job.pk])
    assert "seen-by-recovery-viewers" in client_for("readonly").get(url).content.decode()
    assert "seen-by-recovery-viewers" not in client_for("pauser").get(url).content.decode()


@pytest.mark.parametrize("name", ["summary", "recovery", "security", "jobs", "job"])
def test_anonymous__htmx_requests_redirect_the_whole_page(client_for, make_job, name):
    job = make_job("queued")
    url = reverse(f"problems:{name}", args=[job.pk] if name == "job" else [])
    response = client_for("anonymous").get(
        url, headers={"HX-Request": "true", "HX-Current-URL": f"http://testserver{url}?q=x"}
    )
    assert response.status_code == 200
    assert response["HX-Redirect"] == f"{reverse('problems:login')}?next={url}%3Fq%3Dx"


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
