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
from django.utils import timezone

from .. import signals
from ..policy import redact, truncate_utf8
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
    TransportFailed,
)
from .policy import (
    Verdict,
    classify_exception,
    classify_status,
    display_target,
    redact_headers,
    retry_plan,
)

if TYPE_CHECKING:  # pragma: no cover
    from ..operations import JobContext

log = logging.getLogger("durable.http")

EXCERPT_BYTES = 300
READ_CHUNK = 64 * 1024


def excerpt(body: bytes, secrets: Collection[str] = (), limit: int = EXCERPT_BYTES) -> str:
    """A short, single-line, secret-free view of a body, for error messages and records."""
    text = body[: limit * 2].decode("utf-8", errors="replace")
    text = " ".join(text.split())  # no newlines or control runs in logs
    return truncate_utf8(redact(text, frozenset(secrets)), limit)


@dataclass
class Response:
    status: int
    headers: httpx.Headers
    content: bytes
    method: str
    host: str
    elapsed: float

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return jsonlib.loads(self.content)

    def excerpt(self, secrets: Collection[str] = ()) -> str:
        return excerpt(self.content, secrets)

    def safe_headers(self) -> dict[str, str]:
        return redact_headers(list(self.headers.items()))


class _BoundedDecoder:
    """gzip/deflate decoding that never produces more than the body limit (no zip bombs)."""

    def __init__(self, encoding: str):
        # 32 + MAX_WBITS: accept a gzip or a zlib header.
        self._inflater = zlib.decompressobj(32 + zlib.MAX_WBITS) if encoding else None

    def feed(self, chunk: bytes, room: int) -> bytes:
        if self._inflater is None:
            return chunk
        data = self._inflater.decompress(chunk, room + 1)
        if self._inflater.unconsumed_tail:
            return data + b"\0"  # more output than room: the caller sees it overflow
        return data


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
        try:
            request = self._client.build_request(
                method, url, headers=headers, content=content, json=json, params=params
            )
        except (httpx.InvalidURL, httpx.UnsupportedProtocol, ValueError) as exc:
            raise TransportFailed(f"{config.name}: invalid URL ({type(exc).__name__})") from None
        target = display_target(method, request.url.host, request.url.port)
        started = time.monotonic()
        with network.deadline(config.total_timeout):
            gate_pass = gates.acquire(config, holder=holder) if config.gated else None
            try:
                response = self._exchange(request, target, secrets)
            except (httpx.HTTPError, OSError) as exc:
                raise self._transport_verdict(exc, target, attempt, started) from exc
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

    def _exchange(self, request: httpx.Request, target: str, secrets: Collection[str]) -> Response:
        started = time.monotonic()
        hops = 0
        while True:
            raw = self._client.send(request, stream=True, follow_redirects=False)
            try:
                follow = raw.next_request if self.config.follow_redirects else None
                if follow is not None and hops < self.config.max_redirects:
                    self._read_body(raw, target)  # bounded, then dropped
                    hops += 1
                    request = follow
                    continue
                body = self._read_body(raw, target)
                return Response(
                    status=raw.status_code,
                    headers=raw.headers,
                    content=body,
                    method=request.method,
                    host=request.url.host,
                    elapsed=time.monotonic() - started,
                )
            finally:
                raw.close()

    def _read_body(self, raw: httpx.Response, target: str) -> bytes:
        """Stream the body up to ``max_body_bytes``; past it, stop reading and refuse."""
        limit = self.config.max_body_bytes
        declared = raw.headers.get("content-length", "").strip()
        if declared.isdigit() and int(declared) > limit:
            raise ResponseTooLarge(
                f"{self.config.name}: response too large ({target} declared {declared} bytes; "
                f"the limit is {limit})",
                status=raw.status_code,
            )
        encoding = raw.headers.get("content-encoding", "").strip().lower()
        if encoding in ("", "identity"):
            decoder = _BoundedDecoder("")
        elif encoding in ("gzip", "x-gzip", "deflate"):
            decoder = _BoundedDecoder(encoding)
        else:
            raise TransportFailed(
                f"{self.config.name}: unsupported Content-Encoding {encoding[:40]!r} from {target}",
                status=raw.status_code,
            )
        body = bytearray()
        for chunk in raw.iter_raw(READ_CHUNK):
            data = decoder.feed(chunk, limit - len(body))
            if len(body) + len(data) > limit:
                raise ResponseTooLarge(
                    f"{self.config.name}: response too large ({target} sent more than "
                    f"{limit} bytes; reading stopped there)",
                    status=raw.status_code,
                )
            body += data
            left = network.remaining()
            if left is not None and left <= 0:
                raise httpx.ReadTimeout("total timeout exceeded while reading the body")
        return bytes(body)

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
            )
        log.warning("http request failed", extra=facts)
        return TransportFailed(f"{self.config.name}: {reason} ({target})")

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
            why = (
                "redirect limit reached"
                if self.config.follow_redirects
                else "redirects are not followed for this provider"
            )
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
        # Sent now, not on commit: an atomic unit's transaction is about to roll back.
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
