"""``503`` and a short page, not a ``500``, for a page asked for while the database is unreachable.

Through an outage (a failover, a restart) every page fails the same way: a 500
would tell the person it is broken, and log the traceback of a refused
connection for each request. This middleware turns exactly that error into a
``503 Service Unavailable`` with ``Retry-After``, a page of a few lines (no
template: rendering one may itself need the database), and one log line
without the traceback. Any other error is left to Django. The HTTP API answers
an outage itself, in its JSON shape (``durable.api``); this is for the
dashboard and any other page of the site.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from durable.outage import describe, is_unreachable

log = logging.getLogger("recovery.dashboard")

RETRY_AFTER_SECONDS = 5
PAGE = """<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Temporarily unavailable</title></head>
<body>
<h1>Temporarily unavailable</h1>
<p>The database cannot be reached right now. Try again in a few seconds.</p>
</body>
</html>
"""


class DatabaseUnavailableMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not is_unreachable(exception):
            return None
        log.warning(
            "request failed: database unreachable",
            extra={"method": request.method, "path": request.path, "error": describe(exception)},
        )
        response = HttpResponse(
            PAGE,
            status=503,
            content_type="text/html; charset=utf-8",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS), "Cache-Control": "no-store"},
        )
        # Logged above, without the request's repr (its query string) that Django adds.
        response._has_been_logged = True  # type: ignore[attr-defined]
        return response
