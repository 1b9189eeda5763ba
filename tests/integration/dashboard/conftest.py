"""Dashboard fixtures: users of every role, and jobs in every state made through the engine."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from durable import jobs
from durable.lease import claim
from durable.models import Job
from durable.operations import registered
from tests.integration.helpers import drain

VIEW_ALL = ("durable.view_job", "recovery.view_recoveryevent", "recovery.view_securityevent",
            "durable.view_schedule")  # fmt: skip
EVERY_RIGHT = (*VIEW_ALL, "durable.pause_job", "durable.cancel_job", "durable.retry_job",
               "durable.add_job", "durable.start_privileged_job", "recovery.add_recoveryevent",
               "durable.add_schedule", "durable.change_schedule",
               "durable.delete_schedule")  # fmt: skip
PRIVILEGED = "durable.start_privileged_job"
SCHEDULER = ("durable.view_schedule", "durable.add_schedule", "durable.change_schedule",
             "durable.delete_schedule", "durable.view_job")  # fmt: skip
# role -> (is_staff, permissions as "app_label.codename", is_superuser)
ROLES: dict[str, tuple[bool, tuple[str, ...], bool]] = {
    "nonstaff": (False, EVERY_RIGHT, False),  # every permission, but not staff: nothing
    "noview": (True, (), False),  # staff without any permission: an empty Summary
    "readonly": (True, VIEW_ALL, False),  # looks at everything, changes nothing
    "pauser": (True, ("durable.view_job", "durable.pause_job"), False),
    "canceller": (True, ("durable.view_job", "durable.cancel_job"), False),
    "retrier": (True, ("durable.view_job", "durable.retry_job"), False),
    "blindretrier": (True, ("durable.retry_job",), False),  # may retry, may not look: neither
    "adder": (True, ("durable.view_job", "durable.add_job"), False),
    "privileged": (True, ("durable.view_job", "durable.add_job", PRIVILEGED), False),
    "changer": (True, ("durable.change_job",), False),  # change implies view, as in the admin
    "recorder": (True, ("recovery.view_recoveryevent", "recovery.add_recoveryevent"), False),
    "scheduler": (True, SCHEDULER, False),
    "operator": (True, EVERY_RIGHT, False),  # every right one by one, not a superuser
    "admin": (True, (), True),
}


def permissions(names: tuple[str, ...]) -> list[Permission]:
    found = []
    for name in names:
        app_label, codename = name.split(".")
        found.append(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return found


@pytest.fixture
def make_user(db) -> Callable[..., User]:
    def make(role: str, name: str | None = None) -> User:
        staff, names, superuser = ROLES[role]
        user = User.objects.create_user(
            name or role, password="pw", is_staff=staff, is_superuser=superuser
        )
        user.user_permissions.set(permissions(names))  # a missing one raises DoesNotExist
        return user

    return make


@pytest.fixture
def client_for(make_user) -> Callable[..., Client]:
    """``client_for("pauser")``: a test client logged in as a new user of that role."""

    def make(role: str, **kwargs: Any) -> Client:
        client = Client(**kwargs)
        if role != "anonymous":
            client.force_login(make_user(role))
        return client

    return make


def job_in(state: str, operation: str = "durable.noop", **input: Any) -> Job:
    """A job brought into ``state`` through the engine's own functions."""
    if state == "failed":
        job = jobs.enqueue("test.flaky", {"fail_times": 9, "error": "nonretryable", **input})
        drain(job.pk)
        return Job.objects.get(pk=job.pk)
    job = jobs.enqueue(operation, input or {"units": 3})
    if state == "queued":
        return job
    if state == "completed":
        drain(job.pk)
    elif state in ("running", "cancelling"):
        got = claim("worker-a", queues=["default"], operations=sorted(registered()),
                    lease_seconds=60, job_id=job.pk)  # fmt: skip
        assert got is not None
        if state == "cancelling":
            jobs.cancel(job.pk, actor="setup")
    elif state == "paused":
        jobs.pause(job.pk, actor="setup")
    elif state == "cancelled":
        jobs.cancel(job.pk, actor="setup")
    job = Job.objects.get(pk=job.pk)
    assert job.state == state, job.state
    return job


@pytest.fixture
def make_job(db) -> Callable[..., Job]:
    return job_in
