"""Who may see and do what on the dashboard, and the response headers every page gets.

- Anonymous: the login page (htmx requests get ``HX-Redirect`` so the login
  page replaces the whole page, not a table).
- Logged in but not staff (or inactive): 403 everywhere.
- Staff: what their permissions allow, by the rules in ``rights`` (look needs the
  model's ``view_`` permission; each action, "New job", "Record event" and each
  change of a schedule its own permission). Superusers have every permission.

Refusals of logged-in users are counted in the Security report (one row per
kind: category ``dashboard``), so someone probing for what they may do shows up.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.cache import add_never_cache_headers, patch_vary_headers
from django_htmx.http import HttpResponseClientRedirect

from durable.clientip import request_client_ip
from durable.operations import Operation
from recovery.records import record_security

from . import rights
from .responses import htmx_details

AREA_NAMES = {"jobs": "jobs", "recovery": "Recovery events", "security": "the Security report",
              "schedules": "schedules"}  # fmt: skip


# The client's address, proxy-aware only as far as TRUSTED_PROXY_COUNT says (shared
# with the API, so the audit trail and the Security tallies never disagree).
request_ip = request_client_ip


def is_staff(user: Any) -> bool:
    return bool(user.is_authenticated and user.is_active and user.is_staff)


def held(user: Any) -> frozenset[str]:
    """The permissions ``user`` holds on the dashboard: none unless an active staff user."""
    if not is_staff(user):
        return frozenset()
    return frozenset(user.get_all_permissions())  # cached on the user for the request


def can_view(user: Any, area: str) -> bool:
    """May ``user`` look at ``area`` (jobs, recovery, security, schedules)?"""
    return rights.may_view(held(user), area)


def can_act(user: Any, action: str) -> bool:
    """May ``user`` apply ``action`` (pause, resume, cancel, retry) to jobs?"""
    return rights.may_act(held(user), action)


def can_add(user: Any) -> bool:
    return rights.may_add(held(user))


def can_record(user: Any) -> bool:
    return rights.may_record(held(user))


def can_change_schedules(user: Any, change: str) -> bool:
    return rights.may_change_schedules(held(user), change)


def start_refusal(user: Any, operation: Operation) -> str | None:
    """Why ``user`` may not start (or schedule) ``operation`` by hand; None if they may."""
    return rights.start_refusal(held(user), operation)


def startable(user: Any, operations: dict[str, Operation]) -> dict[str, Operation]:
    """The operations ``user`` may start by hand, by name."""
    perms = held(user)
    return {name: op for name, op in operations.items() if not rights.start_refusal(perms, op)}


def allowed_actions(user: Any) -> frozenset[str]:
    perms = held(user)
    return frozenset(a for a in rights.ACTION_PERMISSIONS if rights.may_act(perms, a))


def visible_areas(user: Any) -> dict[str, bool]:
    """``{"jobs": True, "recovery": False, …}``: what the menu and the Summary show."""
    perms = held(user)
    return {area: rights.may_view(perms, area) for area in rights.VIEW_PERMISSIONS}


def dashboard_headers(response: HttpResponse) -> HttpResponse:
    """One URL answers with a page or a fragment: caches must key on ``HX-Request``.

    The pages hold addresses and user names, so nothing is stored either.
    """
    patch_vary_headers(response, ("HX-Request",))
    add_never_cache_headers(response)
    return response


def count_refusal(request: HttpRequest, key: str, message: str, *, cwe: int = 285) -> None:
    """One more on the Security report's row ``dashboard`` / ``key`` (who, from where)."""
    user = getattr(request, "user", None)
    record_security(
        category="dashboard",
        key=key,
        detail=f"{request.method} {request.path[:200]}: {message}",
        severity="warning",
        cwe=cwe,  # 285: improper authorization; 352: cross-site request forgery
        source="dashboard",
        user_id=getattr(user, "pk", "") or "",
        username=getattr(user, "get_username", lambda: "")(),
        ip=request_ip(request),
    )


def refuse(request: HttpRequest, key: str, message: str) -> HttpResponse:
    """403 with a readable page (or fragment), counted in the Security report."""
    count_refusal(request, key, message)
    template = "problems/_message.html" if htmx_details(request) else "problems/403.html"
    response = render(request, template, {"level": "error", "message": message}, status=403)
    return dashboard_headers(response)


def not_found(request: HttpRequest, message: str) -> HttpResponse:
    """404 as the message (htmx puts 4xx replies in #messages) or as a small page."""
    context = {"level": "error", "message": message, "title": "Not found"}
    template = "problems/_message.html" if htmx_details(request) else "problems/error.html"
    return render(request, template, context, status=404)


CSRF_MESSAGE = (
    "This form's security token is missing or out of date (signed out, or signed in again "
    "in another tab?). Reload the page and try again."
)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """``CSRF_FAILURE_VIEW``: a refused POST says why in the dashboard's own words.

    Django's page has an inline ``<style>`` (a CSP violation in the console) and,
    to htmx, is a whole document swapped into the message area. htmx gets the
    message fragment instead; a plain form post gets a small page. Counted in the
    Security report: a forged request and a stale tab look alike from here.
    """
    count_refusal(request, "csrf-failed", reason or "CSRF check failed", cwe=352)
    context = {"level": "error", "message": CSRF_MESSAGE, "title": "Not accepted"}
    if getattr(request, "htmx", False):
        response = render(request, "problems/_message.html", context, status=403)
    else:
        response = render(request, "problems/error.html", context, status=403)
    return dashboard_headers(response)


def staff_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Wrap a dashboard view: login, staff check, ``Vary`` and no-cache headers."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        user = request.user
        if not user.is_authenticated:
            if htmx := htmx_details(request):
                # Back to the page the user was on, not to the fragment's URL.
                here = htmx.current_url_abs_path or request.get_full_path()
                login = redirect_to_login(here, settings.RECOVERY_LOGIN_URL)["Location"]
                return dashboard_headers(HttpResponseClientRedirect(login))
            login_page = redirect_to_login(request.get_full_path(), settings.RECOVERY_LOGIN_URL)
            return dashboard_headers(login_page)
        if not is_staff(user):
            return refuse(request, "not-staff", "This dashboard is for staff users only.")
        try:
            response = view(request, *args, **kwargs)
        except Http404 as missing:  # with this page's headers too (Vary, no-store)
            response = not_found(request, str(missing) or "There is nothing at this address.")
        return dashboard_headers(response)

    return wrapper


def viewer_of(area: str) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Wrap a page of ``area``: staff only (``staff_required``), and its view permission."""
    permission = rights.VIEW_PERMISSIONS[area][0]

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not can_view(request.user, area):
                return refuse(
                    request,
                    f"no-permission:view-{area}",
                    f"You may not view {AREA_NAMES[area]} ({permission}).",
                )
            return view(request, *args, **kwargs)

        return staff_required(wrapper)

    return decorate
