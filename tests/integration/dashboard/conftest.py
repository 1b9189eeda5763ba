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

# role -> (is_staff, permission codenames on durable.Job, is_superuser)
ROLES: dict[str, tuple[bool, tuple[str, ...], bool]] = {
    "nonstaff": (False, ("pause_job", "cancel_job", "retry_job", "add_job"), False),
    "readonly": (True, (), False),
    "pauser": (True, ("pause_job",), False),
    "canceller": (True, ("cancel_job",), False),
    "retrier": (True, ("retry_job",), False),
    "adder": (True, ("add_job",), False),
    "changer": (True, ("change_job",), False),
    "admin": (True, (), True),
}


@pytest.fixture
def make_user(db) -> Callable[..., User]:
    def make(role: str, name: str | None = None) -> User:
        staff, codenames, superuser = ROLES[role]
        user = User.objects.create_user(
            name or role, password="pw", is_staff=staff, is_superuser=superuser
        )
        perms = Permission.objects.filter(content_type__app_label="durable", codename__in=codenames)
        assert perms.count() == len(codenames), "a permission is missing from the migration"
        user.user_permissions.set(perms)
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
