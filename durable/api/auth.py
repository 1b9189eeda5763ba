"""Bearer tokens and what a client may do; every refusal is announced as a Security summary.

Who may do what: a scope per kind of request (``jobs:read``, ``jobs:write``,
``schedules:read``, ``schedules:write``), and ``jobs:admin`` on top of those
for what reaches beyond the client's own work: starting (or scheduling) an
operation whose ``Operation.access`` is PRIVILEGED, and acting on a job some
other client submitted. A SYSTEM operation is never started through the API.
A job is the client's own when its ``owner`` is the client's ``actor``
(``api:<name>``), which ``POST /jobs`` records.

What goes to ``durable.signals.security_refusal`` is chosen so that a flood of
bad requests adds to a *count*, never to the number of rows: the category and
key name the kind of problem from a fixed set, the detail is a fixed sentence,
and only the actor fields (remote address, client name) vary — those the
Security report tallies with a cap. The presented token never leaves this
module: not in the signal, not in a log line, not in a response.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.http import HttpRequest
from django.utils import timezone

from .. import signals
from ..clientip import request_client_ip
from ..errors import UnknownOperation
from ..models.api import ADMIN_SCOPE, Client
from ..operations import Access, Operation, get_operation, may_start
from .errors import FieldError, Refusal, invalid
from .parse import parse_bearer
from .tokens import token_matches, token_prefix

REALM = "durable-api"
LAST_USED_RESOLUTION = timedelta(minutes=1)  # at most one write per client per minute

# problem key -> (status, RFC 6750 error, detail for the client and the report, CWE)
PROBLEMS: dict[str, tuple[int, str | None, str, str]] = {
    "missing-token": (401, None, "send Authorization: Bearer <token>", "CWE-306"),
    "malformed-header": (
        401,
        "invalid_request",
        "the Authorization header is not 'Bearer <token>'",
        "CWE-287",
    ),
    "invalid-token": (401, "invalid_token", "the bearer token is not valid", "CWE-287"),
    "revoked-token": (401, "invalid_token", "the bearer token is not valid", "CWE-287"),
    "insufficient-scope": (403, "insufficient_scope", "the token lacks a scope", "CWE-285"),
    "operation-not-allowed": (
        403,
        None,
        "the operation is started by the site itself, never through the API",
        "CWE-285",
    ),
}


def refuse(
    request: HttpRequest,
    problem: str,
    *,
    client: Client | None = None,
    scope: str = "",
    why: str = "",
) -> Refusal:
    """Announce the refusal and return the Refusal to raise.

    ``why`` replaces the detail the client reads; the report keeps the fixed one.
    """
    status, error, detail, cwe = PROBLEMS[problem]
    signals.send_now(
        signals.security_refusal,
        category="api-auth",
        key=problem,
        detail=detail,
        severity="warning",
        cwe=cwe,
        source="api",
        user_id=None,
        username=client.name if client else "",
        # TRUSTED_PROXY_COUNT decides how far X-Forwarded-For is believed (0: not at all).
        ip=request_client_ip(request) or "",
    )
    challenge = f'Bearer realm="{REALM}"'
    if error:
        challenge += f', error="{error}"'
    if scope:
        challenge += f', scope="{scope}"'
        detail = f"this token does not have the {scope} scope"
    # A revoked token gets the same answer as an unknown one; the report tells them apart.
    code = "invalid_token" if problem == "revoked-token" else problem.replace("-", "_")
    # A challenge only where another token could help: not for a SYSTEM operation.
    headers = {"WWW-Authenticate": challenge} if status == 401 or error else {}
    return Refusal(status, code, why or detail, headers=headers)


def authenticate(request: HttpRequest, scope: str) -> Client:
    """The client behind the request's bearer token, if it holds ``scope``; else raise."""
    token, problem = parse_bearer(request.META.get("HTTP_AUTHORIZATION"))
    if token is None:
        raise refuse(request, problem or "missing-token")
    prefix = token_prefix(token)
    client = Client.objects.filter(token_prefix=prefix).first() if prefix else None
    # Compare even when nothing was found, so both paths do the same work.
    if not token_matches(token, client.token_hash if client else None) or client is None:
        raise refuse(request, "invalid-token")
    if client.revoked_at is not None:
        raise refuse(request, "revoked-token", client=client)
    if not client.has_scope(scope):
        raise refuse(request, "insufficient-scope", client=client, scope=scope)
    _touch(client)
    return client


def _touch(client: Client) -> None:
    now = timezone.now()
    if client.last_used_at is None or client.last_used_at < now - LAST_USED_RESOLUTION:
        Client.objects.filter(pk=client.pk).update(last_used_at=now)


# --- what an authenticated client may do ------------------------------------------------


def may_act_on(job_owner: str, client: Client) -> bool:
    """Whether ``client`` may cancel, pause, resume or retry a job owned by ``job_owner``."""
    return job_owner == client.actor or client.has_scope(ADMIN_SCOPE)


def offered_operation(name: str) -> Operation:
    """The registered operation ``name``, if ``DURABLE_API_OPERATIONS`` offers it; else 400.

    A name left out of that allow-list gets the same answer as an unknown one.
    """
    allowed = getattr(settings, "DURABLE_API_OPERATIONS", None)
    try:
        if allowed is not None and name not in allowed:
            raise UnknownOperation(name)
        return get_operation(name)
    except UnknownOperation:
        raise invalid(
            [FieldError("operation", f"no operation named {name!r} is available")],
            "unknown operation",
        ) from None


def authorize_operation(request: HttpRequest, client: Client, name: str) -> Operation:
    """The operation, if ``client`` may start it (or schedule it); else raise 400 or 403."""
    operation = offered_operation(name)
    _check_access(request, client, operation)
    return operation


def authorize_schedule_enable(request: HttpRequest, client: Client, name: str) -> None:
    """Enabling a schedule of ``name`` starts its operation again: it needs what creating
    it did (``may_start``). Disabling and removing stop work and need only
    ``schedules:write`` — the dashboard's rule too.

    ``DURABLE_API_OPERATIONS`` is not consulted (it decides what may be created).
    An operation that is no longer registered needs ``jobs:admin``: nobody can
    tell any more what it was allowed.
    """
    try:
        operation = get_operation(name)
    except UnknownOperation:
        if client.has_scope(ADMIN_SCOPE):
            return
        raise refuse(
            request,
            "insufficient-scope",
            client=client,
            scope=ADMIN_SCOPE,
            why=f"{name} is not a registered operation; enabling its schedule needs the "
            f"{ADMIN_SCOPE} scope",
        ) from None
    _check_access(request, client, operation)


def _check_access(request: HttpRequest, client: Client, operation: Operation) -> None:
    name = operation.name
    if may_start(operation, privileged=client.has_scope(ADMIN_SCOPE)):
        return
    if operation.access != Access.PRIVILEGED:  # SYSTEM, or a marking may_start does not know
        raise refuse(
            request,
            "operation-not-allowed",
            client=client,
            why=f"{name} is started by the site itself, never through the API",
        )
    raise refuse(
        request,
        "insufficient-scope",
        client=client,
        scope=ADMIN_SCOPE,
        why=f"{name} is a privileged operation: starting or scheduling it needs the "
        f"{ADMIN_SCOPE} scope",
    )


def authorize_job_action(request: HttpRequest, client: Client, job_id: int, owner: str) -> None:
    """Raise 403 unless ``client`` may act on the job (its own, or with ``jobs:admin``)."""
    if not may_act_on(owner, client):
        raise refuse(
            request,
            "insufficient-scope",
            client=client,
            scope=ADMIN_SCOPE,
            why=f"job {job_id} was not submitted by this client; acting on other clients' "
            f"jobs needs the {ADMIN_SCOPE} scope",
        )
