"""How a dashboard view answers: the whole page or the part htmx swaps, and where a
plain form post goes back to.

One view per page, two renderings (see ``views``): these helpers decide which,
so every view decides it the same way.
"""

from __future__ import annotations

from typing import Any, cast

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django_htmx.middleware import HtmxDetails

from .query import TableQuery

TOOLBAR_ID = "toolbar"  # the search form of the table pages (table_page.html)


class HtmxHttpRequest(HttpRequest):
    """A request as django-htmx's middleware leaves it (the typing its docs suggest)."""

    htmx: HtmxDetails


def htmx_details(request: HttpRequest) -> HtmxDetails:
    """What htmx said about this request (the middleware sets it on every request)."""
    return cast(HtmxHttpRequest, request).htmx


def wants_fragment(request: HttpRequest) -> bool:
    """True for htmx requests that swap a part of the page (not a history restore)."""
    htmx = htmx_details(request)
    return bool(htmx) and not htmx.history_restore_request


def table_fragment(
    request: HttpRequest, template: str, context: dict[str, Any], query: TableQuery
) -> HttpResponse:
    """A table page's results; to the toolbar, with the canonical address to push.

    The form's own URL lists every field, defaults included
    (``?q=&status=all&per_page=10``); the address bar should show the short,
    canonical one the links use, so equal pages have equal addresses.
    """
    response = render(request, template, context)
    if htmx_details(request).trigger == TOOLBAR_ID:
        params = query.params()
        response["HX-Push-Url"] = f"{request.path}?{params}" if params else request.path
    return response


def safe_next(request: HttpRequest, default: str) -> str:
    """Where a plain form post goes back to: a dashboard URL of this site, else ``default``."""
    target = request.POST.get("next") or ""
    ok = url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )
    return target if ok and target.startswith(reverse("problems:summary")) else default
