"""Outbound HTTP policy as pure functions: what to retry, when, and what to show of it.

Nothing here does I/O or reads the clock: the client passes ``now``, the
attempt number, the headers and a random source in, and acts on what comes
back. ``tests/unit/test_http_policy.py`` pins every table down.

Retry timing, in order (docs/how-to/outbound-http.md):

1. ``Retry-After`` is authoritative when valid: non-negative delta seconds, or
   an HTTP date in the future, no further away than ``max_retry_after``.
   Garbage, negative numbers, dates in the past and values beyond the ceiling
   are ignored (an absurd value is more likely a bug than a plan).
2. Otherwise exponential backoff with full jitter, capped by ``backoff_max``.
3. A rate-limit reset header (``X-RateLimit-Reset`` / ``RateLimit-Reset``,
   epoch seconds or delta seconds) may push the time later, never earlier;
   it counts only when the response says the limit is spent (429, 503, or a
   ``*-Remaining: 0`` header), because many APIs send a reset time on every
   response and a 502 with quota left must not wait an hour.
"""

from __future__ import annotations

import enum
import random
import re
import ssl
import sys
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils.http import parse_http_date

from ..policy import MIN_SECRET_CHARS, backoff_delay, redact, truncate_utf8
from ..sanitize import looks_like_credential_key
from .errors import DnsLookupFailed, HttpError, ResponseTooLarge, SsrfRefused

# --- classification ----------------------------------------------------------------

RETRYABLE_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
# The 3xx that point somewhere else (httpx follows exactly these). 304 answers a
# conditional request; 300, 305 and 306 are nothing a client should follow.
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
# Statuses after which a reset header may extend the wait even without "Remaining: 0".
RATE_LIMIT_STATUSES = frozenset({429, 503})
DEFAULT_MAX_RETRY_AFTER = 24 * 3600.0
# A valid Retry-After shorter than this (``0``, a date a moment away) waits this
# long instead: back-to-back retries would spend the attempts in a burst.
RETRY_AFTER_FLOOR = 1.0
# Numbers at or above this are epoch seconds (2001-09-09); below, delta seconds.
EPOCH_THRESHOLD = 1_000_000_000


class Verdict(enum.StrEnum):
    SUCCESS = "success"
    RETRY = "retry"  # transient: try again later, spends an attempt
    FAIL = "fail"  # a verdict, not a glitch: do not repeat
    REDIRECT = "redirect"  # 3xx: followed only when the provider allows it


@dataclass(frozen=True)
class Classification:
    verdict: Verdict
    reason: str  # short, fixed vocabulary: safe to log and to store

    @property
    def retryable(self) -> bool:
        return self.verdict is Verdict.RETRY


def classify_status(status: int) -> Classification:
    """What a status code means for the job.

    Retryable: 408, 425, 429 and the transient 5xx (500, 502, 503, 504). Every
    other 4xx is the request's fault (authentication, authorization,
    validation, not found, conflict…) and repeating it cannot help; nor can
    501/505 and friends, which say the server will never do this.
    """
    if 200 <= status < 300:
        return Classification(Verdict.SUCCESS, "ok")
    if status in RETRYABLE_STATUSES:
        return Classification(Verdict.RETRY, f"HTTP {status}")
    if status in REDIRECT_STATUSES:
        return Classification(Verdict.REDIRECT, f"HTTP {status} redirect")
    if status == 304:
        # An answer to a conditional request: a caller that sends one lists it in accept.
        return Classification(Verdict.FAIL, "HTTP 304: not modified (not accepted by the caller)")
    if 300 <= status < 400:
        return Classification(Verdict.FAIL, f"HTTP {status}: unexpected 3xx answer")
    if status in (401, 407):
        return Classification(Verdict.FAIL, f"HTTP {status}: authentication refused")
    if status == 403:
        return Classification(Verdict.FAIL, "HTTP 403: not authorized")
    if status in (400, 422):
        return Classification(Verdict.FAIL, f"HTTP {status}: request rejected as invalid")
    if 400 <= status < 500:
        return Classification(Verdict.FAIL, f"HTTP {status}: client error")
    if 500 <= status < 600:
        return Classification(Verdict.FAIL, f"HTTP {status}: server refuses permanently")
    return Classification(Verdict.FAIL, f"HTTP {status}: unexpected status")


def cause_chain(exc: BaseException) -> list[BaseException]:
    """The exception and its causes (httpx wraps httpcore, which wraps the ssl error)."""
    chain, seen = [], set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def classify_exception(exc: BaseException) -> Classification:
    """Transport failures: retry what a second try can fix, fail what it cannot.

    Retryable: connect errors, DNS failures, connection resets, and read,
    write, pool and total timeouts. Not retryable: TLS certificate
    verification failures (a wrong or expired certificate stays wrong), an
    SSRF refusal, a response over the size limit, and malformed URLs or
    protocol errors on our side.
    """
    if isinstance(exc, SsrfRefused):
        return Classification(Verdict.FAIL, "refused: address not allowed (SSRF guard)")
    if isinstance(exc, ResponseTooLarge):
        return Classification(Verdict.FAIL, "response too large")
    if isinstance(exc, HttpError):
        return Classification(Verdict.FAIL, exc.kind)
    chain = cause_chain(exc)
    if any(isinstance(item, ssl.SSLCertVerificationError) for item in chain):
        return Classification(Verdict.FAIL, "TLS certificate verification failed")
    httpx = _httpx()
    if httpx is None:  # never imported: no httpx error can exist
        if isinstance(exc, DnsLookupFailed):
            return Classification(Verdict.RETRY, "DNS lookup failed")
        return Classification(Verdict.FAIL, f"unexpected {type(exc).__name__}")
    if isinstance(exc, httpx.ConnectTimeout):
        return Classification(Verdict.RETRY, "connect timeout")
    if isinstance(exc, httpx.ReadTimeout):
        return Classification(Verdict.RETRY, "read timeout")
    if isinstance(exc, httpx.WriteTimeout):
        return Classification(Verdict.RETRY, "write timeout")
    if isinstance(exc, httpx.PoolTimeout):
        return Classification(Verdict.RETRY, "connection pool timeout")
    if isinstance(exc, httpx.ConnectError | DnsLookupFailed):
        if any(isinstance(item, DnsLookupFailed) for item in chain):
            return Classification(Verdict.RETRY, "DNS lookup failed")
        return Classification(Verdict.RETRY, "connect error")
    if isinstance(exc, httpx.ReadError | httpx.WriteError):
        return Classification(Verdict.RETRY, "connection reset")
    if isinstance(exc, httpx.RemoteProtocolError):
        # "Server disconnected", an incomplete chunked body: the peer went away mid-exchange.
        return Classification(Verdict.RETRY, "connection closed mid-response")
    if isinstance(exc, httpx.TooManyRedirects):
        return Classification(Verdict.FAIL, "too many redirects")
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return Classification(Verdict.FAIL, "invalid URL")
    if isinstance(exc, httpx.LocalProtocolError):
        return Classification(Verdict.FAIL, "invalid request")
    if isinstance(exc, httpx.DecodingError):
        return Classification(Verdict.FAIL, "undecodable response body")
    if isinstance(exc, httpx.TransportError):
        return Classification(Verdict.RETRY, "transport error")
    return Classification(Verdict.FAIL, f"unexpected {type(exc).__name__}")


def may_have_reached_server(exc: BaseException) -> bool:
    """Could the request have reached the server and been acted on, although it failed?

    No when it failed before a connection carried it: DNS, connect, pool wait,
    TLS verification, an SSRF refusal, a request httpx or h11 refused to write.
    Otherwise (a reset, a timeout or a closed connection after writing started)
    nobody can tell, so yes.
    """
    if isinstance(exc, HttpError):
        return exc.possibly_sent
    chain = cause_chain(exc)
    if any(isinstance(item, ssl.SSLCertVerificationError) for item in chain):
        return False
    httpx = _httpx()
    if httpx is None:  # never imported: the request was never sent by it
        return not isinstance(exc, DnsLookupFailed)
    before_sending = (
        httpx.ConnectError,
        httpx.ConnectTimeout,
        httpx.PoolTimeout,
        httpx.UnsupportedProtocol,
        httpx.InvalidURL,
        httpx.LocalProtocolError,
        DnsLookupFailed,
    )
    return not isinstance(exc, before_sending)


def _httpx() -> Any:
    """The httpx module if this process imported it, else None.

    Only the HTTP client sends requests, and it imports httpx; a process that
    never did (a worker that ran no webhook or mail unit yet) has no httpx
    error to classify, and starts ~40 ms sooner for not importing it here.
    """
    return sys.modules.get("httpx")


# --- retry timing --------------------------------------------------------------------

_DELTA = re.compile(r"^\s*(\d{1,12})(\.\d{1,6})?\s*$")


def parse_retry_after(
    value: str | None, *, now: datetime, ceiling: float = DEFAULT_MAX_RETRY_AFTER
) -> datetime | None:
    """``Retry-After`` as an absolute time, or None if absent or invalid.

    Delta seconds (non-negative; a decimal fraction is tolerated) or an HTTP
    date (IMF-fixdate, RFC 850 or asctime). Invalid: anything else, negative
    numbers, a date not after ``now``, and anything more than ``ceiling``
    seconds away.
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    match = _DELTA.match(text)
    if match:
        seconds = float(text)
        if seconds > ceiling:
            return None
        return now + timedelta(seconds=seconds)
    try:
        when = datetime.fromtimestamp(parse_http_date(text), tz=UTC)
    except (ValueError, OverflowError, OSError):
        return None
    if when <= now or (when - now).total_seconds() > ceiling:
        return None
    return when


def parse_reset(
    value: str | None, *, now: datetime, ceiling: float = DEFAULT_MAX_RETRY_AFTER
) -> datetime | None:
    """A rate-limit reset header as an absolute time, or None if absent or invalid.

    Values of at least 10⁹ are epoch seconds (GitHub's ``X-RateLimit-Reset``),
    smaller ones delta seconds (the IETF draft's ``RateLimit-Reset``).
    Negative, garbage, past and beyond-the-ceiling values are ignored.
    """
    if value is None:
        return None
    text = value.strip()
    if not _DELTA.match(text):
        return None
    number = float(text)
    if number >= EPOCH_THRESHOLD:
        try:
            when = datetime.fromtimestamp(number, tz=UTC)
        except (OverflowError, OSError, ValueError):
            return None
    else:
        when = now + timedelta(seconds=number)
    if when <= now or (when - now).total_seconds() > ceiling:
        return None
    return when


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None


def limit_spent(status: int, headers: Mapping[str, str]) -> bool:
    """Does the response say the provider's quota is used up (so its reset time matters)?"""
    if status in RATE_LIMIT_STATUSES:
        return True
    for name in ("x-ratelimit-remaining", "ratelimit-remaining"):
        remaining = _header(headers, name)
        if remaining is not None and remaining.strip() == "0":
            return True
    return False


@dataclass(frozen=True)
class RetryPlan:
    at: datetime
    source: str  # "retry-after" | "backoff", plus "+reset" when a reset header extended it

    def delay(self, now: datetime) -> float:
        return (self.at - now).total_seconds()


def retry_plan(
    *,
    attempt: int,
    now: datetime,
    status: int | None = None,
    headers: Mapping[str, str] | None = None,
    backoff_base: float,
    backoff_max: float,
    max_retry_after: float = DEFAULT_MAX_RETRY_AFTER,
    rng: random.Random | None = None,
) -> RetryPlan:
    """When to try again after a retryable outcome (see the module docstring for the order)."""
    headers = headers or {}
    at = parse_retry_after(_header(headers, "retry-after"), now=now, ceiling=max_retry_after)
    source = "retry-after"
    if at is not None:
        at = max(at, now + timedelta(seconds=RETRY_AFTER_FLOOR))
    else:
        delay = backoff_delay(attempt, base=backoff_base, cap=backoff_max, rng=rng)
        at, source = now + timedelta(seconds=delay), "backoff"
    if status is not None and limit_spent(status, headers):
        for name in ("x-ratelimit-reset", "ratelimit-reset"):
            reset = parse_reset(_header(headers, name), now=now, ceiling=max_retry_after)
            if reset is not None and reset > at:
                at, source = reset, f"{source}+reset"
    return RetryPlan(at, source)


def full_jitter(
    attempt: int, *, base: float, cap: float, rng: random.Random | None = None
) -> float:
    """Uniform in [0, min(cap, base·2^(attempt-1))]: the engine's own backoff, re-exported."""
    return backoff_delay(attempt, base=base, cap=cap, rng=rng)


# --- what may be shown -----------------------------------------------------------------

EXCERPT_BYTES = 300


def _drop_secret_start(text: str, secrets: Iterable[str]) -> str:
    """Cut ``text`` where its tail begins a secret (a body read only partly ends mid-token)."""
    cut = len(text)
    for secret in secrets:
        if len(secret) < MIN_SECRET_CHARS:
            continue
        head = secret[:MIN_SECRET_CHARS]
        pos = text.find(head, max(0, len(text) - len(secret) + 1))
        while pos != -1:
            if secret.startswith(text[pos:]):
                cut = min(cut, pos)
                break
            pos = text.find(head, pos + 1)
    return text[:cut]


def body_excerpt(
    body: bytes,
    secrets: Collection[str] = (),
    limit: int = EXCERPT_BYTES,
    *,
    complete: bool = True,
) -> str:
    """A short, single-line, secret-free view of a body, for error messages and records.

    Secrets are redacted over the whole (already bounded) body *before* it is
    cut to ``limit``: cutting first would leave the head of a long token that
    starts inside the excerpt and ends after it (a 960-character JWT echoed
    back kept 265 of its characters). Whitespace is collapsed afterwards and
    the collapsed forms of the secrets are redacted too. ``complete=False``
    says the body is only the beginning of what the server sent, so its last
    characters may be the start of a secret cut in two: such a tail is dropped.
    """
    values = frozenset(s for s in secrets if s)
    text = body.decode("utf-8", errors="replace")
    if not complete:
        text = _drop_secret_start(text, values)
    text = redact(text, values)
    text = " ".join(text.split())  # no newlines or control runs in logs
    text = redact(text, frozenset(" ".join(s.split()) for s in values))
    return truncate_utf8(text, limit)


REDACTED = "[redacted]"
ALWAYS_REDACTED = frozenset(
    {"authorization", "proxy-authorization", "cookie", "set-cookie", "x-signature"}
)


def is_sensitive_header(name: str) -> bool:
    """Authorization and cookies always; anything named like a credential (X-Api-Key…) too."""
    lowered = name.lower()
    return lowered in ALWAYS_REDACTED or looks_like_credential_key(lowered)


def cross_origin_drops(
    headers: Iterable[tuple[str, str]], *, auth_header: str, secrets: Collection[str] = ()
) -> list[str]:
    """The headers a redirect to another origin (scheme, host or port) must not carry.

    The provider's auth header, every header named like a credential
    (``is_sensitive_header``), and any header whose value contains a secret the
    job resolved (a signing key in an unusual header).
    """
    values = [s for s in secrets if len(s) >= MIN_SECRET_CHARS]
    drops: list[str] = []
    for name, value in headers:
        if (
            name.lower() == auth_header.lower()
            or is_sensitive_header(name)
            or any(secret in value for secret in values)
        ) and name.lower() not in (d.lower() for d in drops):
            drops.append(name)
    return drops


def redact_headers(headers: Mapping[str, str] | list[tuple[str, str]]) -> dict[str, str]:
    items = headers.items() if isinstance(headers, Mapping) else headers
    return {name: REDACTED if is_sensitive_header(name) else value for name, value in items}


def display_target(method: str, host: str, port: int | None = None) -> str:
    """What logs and error messages say about a request: method and host, never path or query.

    Paths and query strings carry secrets often enough (signed URLs, Slack-style
    webhook paths, ``?token=``) that they are left out everywhere.
    """
    return f"{method.upper()} {host}" + (f":{port}" if port else "")
