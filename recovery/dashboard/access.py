"""Who may see and do what on the dashboard, and the response headers every page gets.

- Anonymous: the login page (htmx requests get ``HX-Redirect`` so the login
  page replaces the whole page, not a table).
- Logged in but not staff (or inactive): 403 everywhere.
- Staff: may look at every page.
- Actions need a model permission on ``durable.Job``: ``pause_job`` (pause
  and resume), ``cancel_job``, ``retry_job``; ``change_job`` implies all three
  (Django's admin wording for "may change jobs"); ``add_job`` starts jobs from
  "New job". ``recovery.add_recoveryevent`` records a Recovery event by hand.
  Superusers have every permission.

Refusals of logged-in users are counted in the Security report (one row per
kind: category ``dashboard``), so someone probing for what they may do shows up.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.cache import add_never_cache_headers, patch_vary_headers
from django_htmx.http import HttpResponseClientRedirect

from durable.clientip import client_ip
from recovery.records import record_security

ACTION_PERMISSIONS = {
    "pause": "durable.pause_job",
    "resume": "durable.pause_job",
    "cancel": "durable.cancel_job",
    "retry": "durable.retry_job",
}
CHANGE_PERMISSION = "durable.change_job"
ADD_PERMISSION = "durable.add_job"
RECORD_PERMISSION = "recovery.add_recoveryevent"  # "Record event" on the Recovery page


def request_ip(request: HttpRequest) -> str | None:
    """The client's address, proxy-aware only as far as ``TRUSTED_PROXY_COUNT`` says."""
    return client_ip(
        request.META.get("REMOTE_ADDR"),
        request.META.get("HTTP_X_FORWARDED_FOR"),
        int(getattr(settings, "TRUSTED_PROXY_COUNT", 0)),
    )


def is_staff(user: Any) -> bool:
    return bool(user.is_authenticated and user.is_active and user.is_staff)


def can_act(user: Any, action: str) -> bool:
    """May ``user`` apply ``action`` (pause, resume, cancel, retry) to jobs?"""
    permission = ACTION_PERMISSIONS.get(action)
    if permission is None or not is_staff(user):
        return False
    return user.has_perm(permission) or user.has_perm(CHANGE_PERMISSION)


def can_add(user: Any) -> bool:
    return is_staff(user) and user.has_perm(ADD_PERMISSION)


def can_record(user: Any) -> bool:
    return is_staff(user) and user.has_perm(RECORD_PERMISSION)


def allowed_actions(user: Any) -> frozenset[str]:
    return frozenset(action for action in ACTION_PERMISSIONS if can_act(user, action))


def dashboard_headers(response: HttpResponse) -> HttpResponse:
    """One URL answers with a page or a fragment: caches must key on ``HX-Request``.

    The pages hold addresses and user names, so nothing is stored either.
    """
    patch_vary_headers(response, ("HX-Request",))
    add_never_cache_headers(response)
    return response


def refuse(request: HttpRequest, key: str, message: str) -> HttpResponse:
    """403 with a readable page (or fragment), counted in the Security report."""
    user = request.user
    record_security(
        category="dashboard",
        key=key,
        detail=f"{request.method} {request.path[:200]}: {message}",
        severity="warning",
        cwe=285,  # improper authorization
        source="dashboard",
        user_id=getattr(user, "pk", "") or "",
        username=getattr(user, "get_username", lambda: "")(),
        ip=request_ip(request),
    )
    template = "problems/_message.html" if request.htmx else "problems/403.html"
    response = render(request, template, {"level": "error", "message": message}, status=403)
    return dashboard_headers(response)


def staff_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Wrap a dashboard view: login, staff check, ``Vary`` and no-cache headers."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        user = request.user
        if not user.is_authenticated:
            if request.htmx:
                # Back to the page the user was on, not to the fragment's URL.
                here = request.htmx.current_url_abs_path or request.get_full_path()
                login = redirect_to_login(here)["Location"]
                return dashboard_headers(HttpResponseClientRedirect(login))
            return dashboard_headers(redirect_to_login(request.get_full_path()))
        if not is_staff(user):
            return refuse(request, "not-staff", "This dashboard is for staff users only.")
        return dashboard_headers(view(request, *args, **kwargs))

    return wrapper
