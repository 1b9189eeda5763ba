"""``durable.http``: the one outbound HTTP client every operation uses.

    from durable import http

    response = http.request(ctx, "github", "GET", "/repos/acme/app")  # inside a unit

Timeouts (connect and whole-exchange), a bounded response body, per-provider
gates shared by all workers, an SSRF guard, and retry verdicts the engine
persists (``RetryLater`` with the time to try again). See docs/how-to/outbound-http.md,
"Outbound HTTP".

The client's names are loaded on first use, so importing one of this package's
pure modules (``policy``, ``addresses``, ``errors``) — as the mail policy does —
does not load the client and everything it imports.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "client": "client",
    "request": "client",
    "HttpClient": "client",
    "Response": "client",
    "ProviderConfig": "config",
    "provider_config": "config",
    "HttpError": "errors",
    "HttpStatusError": "errors",
    "HttpRetryLater": "errors",
    "GateClosed": "errors",
    "RedirectNotFollowed": "errors",
    "ResponseTooLarge": "errors",
    "SsrfRefused": "errors",
    "TransportFailed": "errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
