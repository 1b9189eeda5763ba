"""Bearer-token authentication; every refusal is announced as a Security summary.

What goes to ``durable.signals.security_refusal`` is chosen so that a flood of
bad requests adds to a *count*, never to the number of rows: the category and
key name the kind of problem from a fixed set, the detail is a fixed sentence,
and only the actor fields (remote address, client name) vary — those the
Security report tallies with a cap. The presented token never leaves this
module: not in the signal, not in a log line, not in a response.
"""

from __future__ import annotations

from datetime import timedelta

from django.http import HttpRequest
from django.utils import timezone

from .. import signals
from ..clientip import request_client_ip
from .errors import Refusal
from .models import Client
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
}


def refuse(
    request: HttpRequest, problem: str, *, client: Client | None = None, scope: str = ""
) -> Refusal:
    """Announce the refusal and return the Refusal to raise."""
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
    return Refusal(status, code, detail, headers={"WWW-Authenticate": challenge})


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
