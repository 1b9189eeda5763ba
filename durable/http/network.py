"""Under httpx: resolve once, check, connect to what was checked, and keep the deadline.

Two jobs that must happen below HTTP, at the socket:

* **SSRF guard.** ``GuardedBackend.connect_tcp`` resolves the host itself,
  refuses the connection if *any* address it got is not allowed (see
  ``addresses``), and then connects to one of exactly those addresses — the
  IP literal goes to ``socket.create_connection``, so there is no second DNS
  lookup and no rebinding window. The URL keeps the host name, so the
  ``Host`` header, TLS SNI and certificate verification all use the name.
  Every new connection goes through here, so a redirect to another host
  (when a provider allows following them) is checked like the first request.
* **Whole-exchange deadline.** httpx's timeouts are per operation: a server
  that sends one byte every few seconds never trips a read timeout. The
  client sets a deadline (a ``ContextVar``, so each worker thread has its
  own) and every socket operation here gets at most the time left until it;
  at the deadline the operation fails as a timeout. The DNS lookup runs in a
  helper thread for the same reason: ``getaddrinfo`` has no timeout.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import httpcore
import httpx

from .addresses import address_refusal, is_allowed_host, normalize_host
from .errors import DnsLookupFailed, SsrfRefused

Resolver = Callable[[str, int], list[str]]

_deadline: ContextVar[float | None] = ContextVar("durable_http_deadline", default=None)


@contextmanager
def deadline(seconds: float) -> Iterator[float]:
    """Every socket operation inside the block must end within ``seconds`` from now."""
    at = time.monotonic() + seconds
    token = _deadline.set(at)
    try:
        yield at
    finally:
        _deadline.reset(token)


def remaining() -> float | None:
    """Seconds left until the current deadline; None outside one."""
    at = _deadline.get()
    return None if at is None else at - time.monotonic()


def _clamp(timeout: float | None, error: type[Exception]) -> float | None:
    left = remaining()
    if left is None:
        return timeout
    if left <= 0:
        raise error("total timeout exceeded")
    return left if timeout is None else min(timeout, left)


def system_resolver(host: str, port: int) -> list[str]:
    """Every address of ``host``, in the order the system resolver prefers them."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: list[str] = []
    for info in infos:
        address = str(info[4][0])
        if address not in seen:
            seen.append(address)
    return seen


def _resolve_within(resolver: Resolver, host: str, port: int, timeout: float | None) -> list[str]:
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def lookup() -> None:
        try:
            outcome["addresses"] = resolver(host, port)
        except BaseException as exc:  # handed to the waiting thread below
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=lookup, name="durable-dns", daemon=True).start()
    if not done.wait(timeout):
        raise httpcore.ConnectTimeout(f"DNS lookup of {host} timed out")
    if "error" in outcome or not outcome["addresses"]:
        # A subclass, not "raise … from": httpcore's pool drops explicit causes.
        raise DnsLookupFailed(f"DNS lookup failed for {host}: {outcome.get('error', 'no address')}")
    return outcome["addresses"]


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class DeadlineStream(httpcore.NetworkStream):
    """A network stream whose every operation is bounded by the current deadline."""

    def __init__(self, stream: httpcore.NetworkStream):
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _clamp(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _clamp(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        stream = self._stream.start_tls(
            ssl_context, server_hostname, _clamp(timeout, httpcore.ConnectTimeout)
        )
        return DeadlineStream(stream)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class GuardedBackend(httpcore.SyncBackend):
    """httpcore's socket backend with the SSRF guard and the deadline in ``connect_tcp``."""

    def __init__(self, *, allow_hosts: Iterable[str] = (), resolver: Resolver | None = None):
        self.allow_hosts = tuple(allow_hosts)
        self.resolver = resolver or system_resolver

    def addresses(self, host: str, port: int, timeout: float | None) -> list[str]:
        """Resolve ``host`` once and check every address; SsrfRefused if any is not allowed."""
        name = normalize_host(host)
        if _is_ip_literal(name):
            found = [name]
        else:
            found = _resolve_within(self.resolver, name, port, timeout)
        if is_allowed_host(name, self.allow_hosts):
            return found
        for address in found:
            refusal = address_refusal(address)
            if refusal is not None:
                via = "" if address == name else f" (it resolves to {address})"
                raise SsrfRefused(
                    f"refused to connect to {name}{via}: a {refusal.describe()}; "
                    f"outbound requests may only reach public addresses unless the host is "
                    f"allow-listed",
                    host=name,
                    address_class=refusal.kind,
                    form=refusal.form,
                )
        return found

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        found = self.addresses(host, port, _clamp(timeout, httpcore.ConnectTimeout))
        error: Exception | None = None
        for address in found:
            try:
                stream = super().connect_tcp(
                    address,  # the checked IP literal: create_connection does no DNS lookup
                    port,
                    timeout=_clamp(timeout, httpcore.ConnectTimeout),
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
                continue
            return DeadlineStream(stream)
        assert error is not None  # found is never empty
        raise error


def ssl_context(verify: bool | str) -> ssl.SSLContext:
    """httpx's default trust store (certifi), or a CA bundle file; False disables verification."""
    import certifi

    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    cafile = verify if isinstance(verify, str) else certifi.where()
    return ssl.create_default_context(cafile=cafile)


class GuardedTransport(httpx.HTTPTransport):
    """httpx's transport with our backend underneath; never uses proxies from the environment.

    httpx 0.28 offers no public way to pass a network backend, so the
    connection pool is rebuilt with one. The SSRF tests fail if that ever
    stops taking effect.
    """

    def __init__(
        self, *, backend: GuardedBackend, verify: bool | str, limits: httpx.Limits
    ) -> None:
        context = ssl_context(verify)
        super().__init__(verify=context, trust_env=False, limits=limits)
        self._pool = httpcore.ConnectionPool(
            ssl_context=context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=backend,
        )
