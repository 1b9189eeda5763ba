"""What the outbound client raises. Non-retryable ones are ``NonRetryable`` verdicts.

Messages name the provider, the method and the host — never the path, the
query string, a header value or more than a short, redacted body excerpt —
because they end up in the job's error history, its events and the logs.
"""

from __future__ import annotations

from datetime import datetime

import httpcore

from ..errors import NonRetryable, RetryLater


class HttpError(NonRetryable):
    """A non-retryable outcome of an outbound request.

    ``possibly_sent`` is True when the request may have reached the server and
    been acted on although we hold no answer for it (the connection failed after
    the request was written, or a 2xx came back with a body we refused): a
    delivery record keeps that doubt instead of hiding it.
    """

    kind = "http error"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        excerpt: str = "",
        possibly_sent: bool = False,
    ):
        super().__init__(message)
        self.status = status
        self.excerpt = excerpt
        self.possibly_sent = possibly_sent


class HttpStatusError(HttpError):
    kind = "non-retryable HTTP status"


class RedirectNotFollowed(HttpStatusError):
    kind = "redirect not followed"


class ResponseTooLarge(HttpError):
    kind = "response too large"


class TransportFailed(HttpError):
    """A transport failure a second try cannot fix (TLS verification, invalid URL…)."""

    kind = "transport failure"


class UndecodableBody(HttpError):
    """A gzip/deflate body that is corrupt or ends before its stream does."""

    kind = "undecodable response body"


class TransactionOpen(HttpError):
    """A programming error: ``durable.http`` was called inside an open database transaction."""

    kind = "request inside a database transaction"


class SsrfRefused(HttpError):
    """The destination resolves to an address outbound requests may not reach (CWE-918)."""

    kind = "SSRF refusal"

    def __init__(self, message: str, *, host: str, address_class: str, form: str = ""):
        super().__init__(message)
        self.host = host
        self.address_class = address_class
        self.form = form


class DnsLookupFailed(httpcore.ConnectError):
    """The host name did not resolve; httpx reports it as a ``ConnectError`` caused by this."""


class HttpRetryLater(RetryLater):
    """A retryable outcome: the engine reschedules the job at ``at`` and counts the attempt."""

    def __init__(
        self,
        reason: str,
        *,
        at: datetime,
        status: int | None = None,
        excerpt: str = "",
        source: str = "backoff",
        possibly_sent: bool = False,
    ):
        super().__init__(reason, at=at, consume_attempt=True)
        self.status = status
        self.excerpt = excerpt
        self.source = source
        self.possibly_sent = possibly_sent  # see HttpError


class GateClosed(RetryLater):
    """A provider gate (in-flight limit or spacing) said "not yet": no attempt is spent."""

    possibly_sent = False  # turned away before anything was sent

    def __init__(self, reason: str, *, at: datetime):
        super().__init__(reason, at=at, consume_attempt=False)
