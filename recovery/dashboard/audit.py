"""Every dashboard action becomes a Recovery event: who, from where, what, on which jobs, done.

Written with ``recovery.records.record_event``, which never raises: an audit
write that fails is logged and can never undo or block the action itself.
Failed logins are counted in the Security report instead (one row per kind).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.contrib.auth.signals import user_login_failed
from django.http import HttpRequest
from django.urls import reverse

from recovery.records import record_event, record_security

from .access import request_ip

ACTION_EVENT = "job-action"  # one job or selected rows, applied at once
BULK_EVENT = "job-bulk-action"  # everything matching a filter, as a durable job
CREATED_EVENT = "job-created"  # "New job"
DISCARD_EVENT = "job-discarded"  # finished jobs deleted by hand (one, selected)
QUEUE_EVENT = "queue-action"  # a queue paused or resumed


def event_for(action: str) -> str:
    return DISCARD_EVENT if action == "discard" else ACTION_EVENT


# Schedules: see recovery.dashboard.schedules (schedule-created, schedule-action).


def actor(request: HttpRequest) -> str:
    """The name jobs' own event logs record for a dashboard user."""
    return request.user.get_username()


def record_action(
    request: HttpRequest,
    type: str,
    *,
    detail: str,
    done: bool,
    job_ids: Sequence[int] = (),
    object_ids: Sequence[str] | None = None,
    titles: Sequence[str] = (),
    job_id: int | None = None,
    operation: str = "",
    reason: str = "",
    severity: str | None = None,
) -> Any:
    user = request.user
    return record_event(
        type,
        severity=severity or ("info" if done else "warning"),
        source="dashboard",
        detail=detail,
        done=done,
        user_id=user.pk,
        username=user.get_username(),
        ip=request_ip(request),
        object_ids=list(object_ids) if object_ids is not None else [str(i) for i in job_ids],
        object_titles=list(titles) if titles else None,
        job_id=job_id,
        operation=operation,
        reason=reason,
    )


def on_login_failed(sender: Any, credentials: dict, request: HttpRequest | None = None, **kw: Any):
    """A wrong password on the dashboard's login page: one more on its Security row."""
    if request is None or request.path != reverse("problems:login"):
        return  # the admin's own login page is Django's business
    record_security(
        category="dashboard-login",
        key="bad-credentials",
        detail="wrong username or password on the dashboard login page",
        severity="warning",
        cwe=307,  # improper restriction of excessive authentication attempts
        source="dashboard",
        username=str(credentials.get("username") or "")[:150],
        ip=request_ip(request),
    )


user_login_failed.connect(on_login_failed, dispatch_uid="recovery.dashboard.on_login_failed")
