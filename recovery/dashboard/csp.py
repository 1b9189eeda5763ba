"""A Content-Security-Policy header on every response that does not set its own.

The dashboard has no inline script, no inline event handler and no inline
style (progress bars are ``<progress>`` elements, the chart's geometry is SVG
attributes, htmx is told not to inject its indicator styles), so the policy
can forbid them all: injected markup that slipped past escaping still could
not run. Django 6 brings its own CSP middleware (``SECURE_CSP``); this one is
small enough to replace with it then.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

DEFAULT_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "font-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        configured = getattr(settings, "CONTENT_SECURITY_POLICY", None)
        self.policy = DEFAULT_POLICY if configured is None else configured

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if self.policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = self.policy
        return response
