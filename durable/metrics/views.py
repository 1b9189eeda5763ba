"""``GET /metrics``: a bearer token with ``metrics:read``, or a staff session.

The token path is the API's own (``durable.api.auth``), so a refused scrape is
tallied under Problems → Security like any other refused API request.
"""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from ..api.auth import authenticate
from ..api.errors import Refusal
from ..api.views import refused
from ..models.api import METRICS_SCOPE
from .collector import build_registry


def staff_session(request: HttpRequest) -> bool:
    """A signed-in staff user may look at the figures in a browser (no token needed)."""
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_active and user.is_staff)


@csrf_exempt
@transaction.non_atomic_requests
def metrics_view(request: HttpRequest) -> HttpResponse:
    try:
        if request.method not in ("GET", "HEAD"):
            raise Refusal(
                405,
                "method_not_allowed",
                f"{request.method} is not allowed here",
                headers={"Allow": "GET, HEAD"},
            )
        if not (staff_session(request) and "HTTP_AUTHORIZATION" not in request.META):
            authenticate(request, METRICS_SCOPE)
        body = generate_latest(build_registry())
        response = HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
    except Refusal as refusal:
        response = refused(request, refusal)
    response["Cache-Control"] = "no-store"
    return response
