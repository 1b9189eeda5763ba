"""The operation picker of "New job" and "New schedule": which operations this user may
start, and the answer when the one asked for is not among them.

A schedule starts its operation again and again, so both pages obey one rule
(``rights.start_refusal``) and share this code rather than copy it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from durable.operations import Operation, registered

from . import rights
from .access import count_refusal, start_refusal, startable
from .context import page_context


def refusal_text(name: str, refusal: str) -> str:
    """Why an operation may not be started (or scheduled) by hand, for the message."""
    if refusal == rights.PRIVILEGED_REFUSAL:
        return (
            f"Starting {name} needs the permission {rights.PRIVILEGED_PERMISSION} "
            "(it reads or replaces data beyond its own rows)."
        )
    return f"{name} is started by the site itself, never by hand."


def refuse_operation(
    request: HttpRequest, name: str, refusal: str, template: str, context: dict[str, Any]
) -> HttpResponse:
    """403 with the page and the reason, counted in Security (``start_refusal``'s reasons)."""
    text = refusal_text(name, refusal)
    count_refusal(request, f"no-permission:start-{refusal}", text)
    messages.error(request, text)
    return render(request, template, context, status=403)


@dataclass(frozen=True)
class Chosen:
    """The operation a form page is for, and the page's context so far."""

    name: str
    operation: Operation
    context: dict[str, Any]


def choose_operation(request: HttpRequest, section: str, template: str) -> Chosen | HttpResponse:
    """The operation asked for (``?operation=``, or the POSTed one) among those this user
    may start — New job and New schedule alike.

    Anything else is answered here: no choice or an unknown name, the page with the
    list (and a message); an operation this user may not start, 403 with the reason,
    counted in Security (``refuse_operation``).
    """
    everything = dict(sorted(registered().items()))
    available = startable(request.user, everything)
    source = request.POST if request.method == "POST" else request.GET
    name = source.get("operation") or ""
    operation = available.get(name)
    context = page_context(request, section, operations=available, chosen=name if operation else "")
    if operation is not None:
        return Chosen(name, operation, context)
    if name in everything:
        refusal = start_refusal(request.user, everything[name]) or rights.SYSTEM_REFUSAL
        return refuse_operation(request, name, refusal, template, context)
    if name:
        messages.error(request, f"There is no operation named {name[:100]!r}.")
    return render(request, template, context)
