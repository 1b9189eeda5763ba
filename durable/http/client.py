"""The one outbound HTTP client: timeouts, bounded bodies, gates, SSRF guard, retry verdicts.

``HttpClient.request`` returns a ``Response`` for a 2xx (or a status the
caller accepts) and otherwise *raises the verdict*: ``HttpRetryLater`` (the
engine reschedules the job at a computed time and counts the attempt),
``GateClosed`` (rescheduled, no attempt spent), or an ``HttpError`` subclass
(non-retryable: the job fails). It never sleeps for a retry — the job's
``next_attempt_at`` is the wait, and it survives restarts.

One long-lived ``httpx.Client`` per provider and process (``client(name)``);
the transport is injectable for tests (an injected transport replaces the
network layer, SSRF guard included).
"""

from __future__ import annotations

import json as jsonlib
import logging
import threading
import time
import zlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
from django.db import connections
from django.utils import timezone

from .. import signals, tracing
from ..models import in_callers_transaction
from ..policy import truncate_utf8
from . import gates, network
from .config import ProviderConfig, provider_config
from .errors import (
    GateClosed,
    HttpError,
    HttpRetryLater,
    HttpStatusError,
    RedirectNotFollowed,
    ResponseTooLarge,
    SsrfRefused,
    TransactionOpen,
    TransportFailed,
    UndecodableBody,
)
from .policy import (
    EXCERPT_BYTES,
    Verdict,
    body_excerpt,
    classify_exception,
    classify_status,
    cross_origin_drops,
    display_target,
    may_have_reached_server,
    redact_headers,
    retry_plan,
)

if TYPE_CHECKING:  # pragma: no cover
    from ..operations import JobContext

log = logging.getLogger("durable.http")

# httpx and httpcore log every request's full URL, query string included, at INFO
# and DEBUG; signed URLs and ``?token=`` would reach the logs. Quiet unless an
# operator configured these loggers on purpose.
for _name in ("httpx", "httpcore"):
    if logging.getLogger(_name).level == logging.NOTSET:
        logging.getLogger(_name).setLevel(logging.WARNING)

READ_CHUNK = 64 * 1024
# How much of a body we read when we only want an excerpt of it (an error status,
# a redirect hop): enough for the excerpt and any secret redacted in it.
PARTIAL_BODY_BYTES = 16 * 1024
# Marks a response whose Location header httpx could not parse (a response extension).
_BAD_LOCATION = "durable_bad_location"


def excerpt(
    body: bytes, secrets: Collection[str] = (), limit: int = EXCERPT_BYTES, *, complete: bool = True
) -> str:
    """A short, single-line, secret-free view of a body (``policy.body_excerpt``)."""
    return body_excerpt(body, secrets, limit, complete=complete)


def open_transaction() -> str | None:
    """The alias of a database connection inside a transaction its caller opened, or None.

    A request made there would hold the provider gate's row lock (PostgreSQL) or
    SQLite's write lock for the whole exchange, keep its in-flight slot invisible
    to other workers, and lose the SSRF refusal it records when the transaction
    rolls back. (A test case's own wrapping transaction does not count.)
    """
    for conn in connections.all(initialized_only=True):
        if in_callers_transaction(conn):
            return conn.alias
    return None


def _flag_bad_location(response: httpx.Response) -> None:
    """Response hook: drop a Location httpx cannot parse, so the status decides the verdict.

    httpx builds the next request for every 3xx with a Location, even when it
    does not follow it, and reports an unparseable one as a protocol error —
    which we would retry, and which says nothing about the redirect itself.
    """
    location = response.headers.get("location")
    if location is None or not response.is_redirect:
        return
    try:
        httpx.URL(location)  # what httpx's redirect handling parses, and fails on
    except (httpx.InvalidURL, ValueError):
        del response.headers["location"]
        response.extensions[_BAD_LOCATION] = True


@dataclass
class Response:
    status: int
    headers: httpx.Headers
    content: bytes
    method: str
    host: str
    elapsed: float
    # False when only the beginning of the body was read (an error status: an excerpt's worth).
    complete: bool = True
    bad_location: bool = False

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return jsonlib.loads(self.content)

    def excerpt(self, secrets: Collection[str] = ()) -> str:
        return excerpt(self.content, secrets, complete=self.complete)

    def safe_headers(self) -> dict[str, str]:
        return redact_headers(list(self.headers.items()))


class _Undecodable(Exception):
    """The compressed body is corrupt or ends before its stream does."""


class _BoundedDecoder:
    """gzip/deflate decoding that never produces more than the body limit (no zip bombs)."""

    def __init__(self, encoding: str):
        # 32 + MAX_WBITS: accept a gzip or a zlib header (RFC 9110's "deflate" is zlib).
        self._inflater = zlib.decompressobj(32 + zlib.MAX_WBITS) if encoding else None
        self._fed = 0

    def feed(self, chunk: bytes, room: int) -> bytes:
        if self._inflater is None:
            return chunk
        self._fed += len(chunk)
        try:
            data = self._inflater.decompress(chunk, room + 1)
        except zlib.error:
            raise _Undecodable("corrupt compressed data") from None
        if self._inflater.unconsumed_tail:
            return data + b"\0"  # more output than room: the caller sees it overflow
        return data

    def finish(self) -> None:
        """After the last chunk: a stream that never reached its end is truncated, not done."""
        if self._inflater is not None and self._fed and not self._inflater.eof:
            raise _Undecodable("the compressed stream ends early")


class HttpClient:
    def __init__(
        self,
        config: ProviderConfig,
        *,
        transport: httpx.BaseTransport | None = None,
        resolver: network.Resolver | None = None,
    ):
        self.config = config
        if transport is None:
            backend = network.GuardedBackend(allow_hosts=config.allow_hosts, resolver=resolver)
            limits = httpx.Limits(max_connections=max(config.max_in_flight, 10) * 2)
            transport = network.GuardedTransport(
                backend=backend, verify=config.verify, limits=limits
            )
        self._client = httpx.Client(
            transport=transport,
            base_url=config.base_url,
            headers={
                "User-Agent": config.user_agent,
                # We read raw bytes and bound them; ask for no compression at all.
                "Accept-Encoding": "identity",
                **config.headers,
            },
            timeout=httpx.Timeout(
                config.total_timeout, connect=min(config.connect_timeout, config.total_timeout)
            ),
            follow_redirects=False,
            trust_env=False,
            event_hooks={"response": [_flag_bad_location]},
        )

    def close(self) -> None:
        self._client.close()

    # --- the request ----------------------------------------------------------------

    def request(
        self,
        method: str,
        url: str,
        *,
        attempt: int = 1,
        headers: Mapping[str, str] | None = None,
        content: bytes | str | None = None,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        accept: Collection[int] = (),
        secrets: Collection[str] = (),
        holder: str = "",
    ) -> Response:
        """Send one request under the provider's limits; return a 2xx or raise the verdict.

        ``attempt`` (from 1) sizes the backoff; ``accept`` lists non-2xx statuses
        the caller handles itself (e.g. 404 for "already gone"); ``secrets`` are
        redacted from every excerpt and message.
        """
        config = self.config
        alias = open_transaction()
        if alias is not None:
            raise TransactionOpen(
                f"{config.name}: refusing to send {method.upper()} inside an open transaction "
                f"on database {alias!r} (transaction.atomic(), or an operation with "
                "atomic_units = True): the provider gate and the SSRF report would be held or "
                "rolled back with it; make the request outside the transaction"
            )
        try:
            request = self._client.build_request(
                method, url, headers=headers, content=content, json=json, params=params
            )
        except UnicodeEncodeError:
            raise TransportFailed(
                f"{config.name}: invalid request (a header value is not ASCII)"
            ) from None
        except (httpx.InvalidURL, httpx.UnsupportedProtocol, ValueError) as exc:
            raise TransportFailed(f"{config.name}: invalid URL ({type(exc).__name__})") from None
        target = display_target(method, request.url.host, request.url.port)
        started = time.monotonic()
        with network.deadline(config.total_timeout):
            gate_pass = gates.acquire(config, holder=holder) if config.gated else None
            try:
                with tracing.client_span(request.method, request.url, request.headers) as span:
                    try:
                        response = self._exchange(request, target, secrets, accept)
                    except BaseException as exc:
                        tracing.request_failed(span, exc)
                        raise
                    tracing.response_status(span, response.status)
            except (httpx.HTTPError, OSError) as exc:
                # "from None": the chain holds h11's and the socket's own messages, which
                # can quote a header value verbatim ("Illegal header value b'Bearer …'"),
                # and the engine stores the traceback of the whole chain.
                raise self._transport_verdict(exc, target, attempt, started) from None
            except SsrfRefused as exc:
                self._announce_refusal(exc, target)
                raise
            except HttpError as exc:
                log.warning(
                    "http request failed",
                    extra=self._facts(target, attempt, started, outcome=exc.kind),
                )
                raise
            finally:
                if gate_pass is not None:
                    gates.release(gate_pass)
        return self._status_verdict(response, target, attempt, accept, secrets)

    def _exchange(
        self,
        request: httpx.Request,
        target: str,
        secrets: Collection[str],
        accept: Collection[int],
    ) -> Response:
        started = time.monotonic()
        hops = 0
        while True:
            self._bound_pool_wait(request)
            raw = self._client.send(request, stream=True, follow_redirects=False)
            try:
                follow = raw.next_request if self.config.follow_redirects else None
                if follow is not None and hops < self.config.max_redirects:
                    self._read_body(raw, target, partial=True)  # bounded, then dropped
                    hops += 1
                    if _origin(follow.url) != _origin(request.url):
                        # httpx drops only Authorization and Cookie on a change of origin;
                        # our auth header may be X-Api-Key, and config headers may carry
                        # keys too. None of them may reach another host.
                        for name in cross_origin_drops(
                            follow.headers.multi_items(),
                            auth_header=self.config.auth_header,
                            secrets=secrets,
                        ):
                            follow.headers.pop(name, None)
                    request = follow
                    continue
                status = raw.status_code
                wanted = 200 <= status < 300 or status in accept
                body, complete = self._read_body(raw, target, partial=not wanted)
                return Response(
                    status=status,
                    headers=raw.headers,
                    content=body,
                    method=request.method,
                    host=request.url.host,
                    elapsed=time.monotonic() - started,
                    complete=complete,
                    bad_location=bool(raw.extensions.get(_BAD_LOCATION)),
                )
            finally:
                raw.close()

    @staticmethod
    def _bound_pool_wait(request: httpx.Request) -> None:
        """Cut every httpx timeout, the wait for a pooled connection included, to the deadline.

        The socket operations are clamped below httpx (``network``), but the wait
        for a free connection in the pool is not a socket operation.
        """
        left = network.remaining()
        if left is None:
            return
        left = max(left, 0.001)
        timeouts = request.extensions.get("timeout") or {}
        request.extensions["timeout"] = {
            key: left if value is None else min(value, left) for key, value in timeouts.items()
        }

    def _read_body(
        self, raw: httpx.Response, target: str, *, partial: bool = False
    ) -> tuple[bytes, bool]:
        """Stream the body: all of it up to ``max_body_bytes`` (past it, stop and refuse),
        or with ``partial`` only its first ``PARTIAL_BODY_BYTES`` for an excerpt.

        Returns the body and whether it is complete. A partial read never fails on
        size or encoding: an error status is classified by its status, not by its body.
        """
        name = self.config.name
        limit = (
            min(PARTIAL_BODY_BYTES, self.config.max_body_bytes)
            if partial
            else (self.config.max_body_bytes)
        )
        status = raw.status_code
        reached = 200 <= status < 300  # the server took the request; only its answer failed
        declared = raw.headers.get("content-length", "").strip()
        if not partial and declared.isdigit() and int(declared) > limit:
            raise ResponseTooLarge(
                f"{name}: response too large ({target} declared {declared} bytes; "
                f"the limit is {limit})",
                status=status,
                possibly_sent=reached,
            )
        encoding = raw.headers.get("content-encoding", "").strip().lower()
        if encoding in ("", "identity"):
            decoder = _BoundedDecoder("")
        elif encoding in ("gzip", "x-gzip", "deflate"):
            decoder = _BoundedDecoder(encoding)
        elif partial:
            return b"", False
        else:
            raise TransportFailed(
                f"{name}: unsupported Content-Encoding {encoding[:40]!r} from {target}",
                status=status,
                possibly_sent=reached,
            )
        body = bytearray()
        try:
            for chunk in raw.iter_raw(READ_CHUNK):
                data = decoder.feed(chunk, limit - len(body))
                if len(body) + len(data) > limit:
                    if partial:
                        body += data[: limit - len(body)]
                        return bytes(body), False
                    raise ResponseTooLarge(
                        f"{name}: response too large ({target} sent more than "
                        f"{limit} bytes; reading stopped there)",
                        status=status,
                        possibly_sent=reached,
                    )
                body += data
                left = network.remaining()
                if left is not None and left <= 0:
                    raise httpx.ReadTimeout("total timeout exceeded while reading the body")
            decoder.finish()
        except _Undecodable as exc:
            if partial:
                return bytes(body), False
            raise UndecodableBody(
                f"{name}: undecodable response body from {target} ({encoding}: {exc})",
                status=status,
                possibly_sent=reached,
            ) from None
        return bytes(body), True

    # --- verdicts -------------------------------------------------------------------

    def _facts(self, target: str, attempt: int, started: float, **extra: Any) -> dict[str, Any]:
        return {
            "provider": self.config.name,
            "target": target,
            "attempt": attempt,
            "elapsed_ms": round((time.monotonic() - started) * 1000),
            **extra,
        }

    def _transport_verdict(
        self, exc: BaseException, target: str, attempt: int, started: float
    ) -> Exception:
        classification = classify_exception(exc)
        reason = classification.reason
        if isinstance(exc, httpx.TimeoutException):
            left = network.remaining()
            if left is None or left <= 0.05 or "total timeout" in str(exc):
                reason = f"total timeout of {self.config.total_timeout:g}s exceeded"
        facts = self._facts(target, attempt, started, outcome=reason)
        if classification.verdict is Verdict.RETRY:
            now = timezone.now()
            plan = retry_plan(
                attempt=attempt,
                now=now,
                backoff_base=self.config.backoff_base,
                backoff_max=self.config.backoff_max,
                max_retry_after=self.config.max_retry_after,
            )
            log.info(
                "http request failed; will retry",
                extra={**facts, "retry_at": plan.at.isoformat()},
            )
            return HttpRetryLater(
                f"{self.config.name}: {reason} ({target}); retry at {plan.at.isoformat()}",
                at=plan.at,
                source=plan.source,
                possibly_sent=may_have_reached_server(exc),
            )
        log.warning("http request failed", extra=facts)
        return TransportFailed(
            f"{self.config.name}: {reason} ({target})", possibly_sent=may_have_reached_server(exc)
        )

    def _status_verdict(
        self,
        response: Response,
        target: str,
        attempt: int,
        accept: Collection[int],
        secrets: Collection[str],
    ) -> Response:
        status = response.status
        classification = classify_status(status)
        facts = {
            "provider": self.config.name,
            "target": target,
            "attempt": attempt,
            "status": status,
            "bytes": len(response.content),
            "elapsed_ms": round(response.elapsed * 1000),
        }
        if classification.verdict is Verdict.SUCCESS or status in accept:
            log.debug("http request done", extra=facts)
            return response
        snippet = response.excerpt(secrets)
        shown = f"; body: {snippet}" if snippet else ""
        if classification.verdict is Verdict.RETRY:
            now = timezone.now()
            plan = retry_plan(
                attempt=attempt,
                now=now,
                status=status,
                headers=response.headers,
                backoff_base=self.config.backoff_base,
                backoff_max=self.config.backoff_max,
                max_retry_after=self.config.max_retry_after,
            )
            log.info(
                "http request failed; will retry",
                extra={**facts, "retry_at": plan.at.isoformat(), "retry_source": plan.source},
            )
            raise HttpRetryLater(
                f"{self.config.name}: {classification.reason} from {target}; retry at "
                f"{plan.at.isoformat()} ({plan.source}){shown}",
                at=plan.at,
                status=status,
                excerpt=snippet,
                source=plan.source,
            )
        log.warning("http request failed", extra={**facts, "outcome": classification.reason})
        if classification.verdict is Verdict.REDIRECT:
            if not self.config.follow_redirects:
                why = "redirects are not followed for this provider"
            elif response.bad_location:
                why = "its Location header is not a valid URL"
            else:
                why = "redirect limit reached"
            raise RedirectNotFollowed(
                f"{self.config.name}: {classification.reason} from {target}; {why}",
                status=status,
                excerpt=snippet,
            )
        raise HttpStatusError(
            f"{self.config.name}: {classification.reason} from {target}{shown}",
            status=status,
            excerpt=snippet,
        )

    def _announce_refusal(self, exc: SsrfRefused, target: str) -> None:
        log.warning(
            "outbound request refused by the SSRF guard",
            extra={
                "provider": self.config.name,
                "target": target,
                "address_class": exc.address_class,
                "form": exc.form,
            },
        )
        # Sent now: there is no transaction to wait for (requests refuse to run inside one).
        signals.send_now(
            signals.security_refusal,
            category="ssrf",
            key=f"ssrf-{exc.address_class}",
            detail=truncate_utf8(f"provider {self.config.name}: {exc}", 500),
            severity="warning",
            cwe="CWE-918",
            source="durable.http",
            user_id=None,
            username=None,
            ip=None,
        )


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    return (url.scheme, url.host, url.port)


# --- one client per provider and process --------------------------------------------

_clients: dict[str, HttpClient] = {}
_clients_lock = threading.Lock()


def client(provider: str) -> HttpClient:
    """The process's long-lived client for ``provider`` (rebuilt if its settings changed)."""
    config = provider_config(provider)
    with _clients_lock:
        existing = _clients.get(provider)
        if existing is not None and existing.config == config:
            return existing
        # A replaced client is left to the garbage collector: another thread may
        # still be using it, and its pooled connections close with it.
        fresh = HttpClient(config)
        _clients[provider] = fresh
        return fresh


def request(ctx: JobContext, provider: str, method: str, url: str, **kwargs: Any) -> Response:
    """A request from inside a unit: the job's attempt, its secrets and the provider's auth.

    ``auth_credential`` in the provider's settings names a credential; its value
    is resolved now (a missing one pauses the job) and sent in ``auth_header``,
    and the job's error history and events redact it.
    """
    http = client(provider)
    headers = dict(kwargs.pop("headers", None) or {})
    config = http.config
    if config.auth_credential:
        secret = ctx.credential(config.auth_credential)
        headers[config.auth_header] = f"{config.auth_scheme} {secret}".strip()
    return http.request(
        method,
        url,
        attempt=ctx.attempt,
        headers=headers,
        secrets=frozenset(ctx.secrets),
        holder=f"job {ctx.job_id} on {ctx.worker_id}",
        **kwargs,
    )


__all__ = [
    "GateClosed",
    "HttpClient",
    "HttpError",
    "HttpRetryLater",
    "Response",
    "client",
    "request",
]
