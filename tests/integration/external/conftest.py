"""Fixtures for the outbound tests: real local HTTP and SMTP servers, provider settings."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import django
import pytest

from durable.http import client as http_client

from ..servers import BlackHole, HttpServer

TEST_PROVIDER = "test"


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A safety net: if the SSRF guard ever broke, no test may connect beyond 127.0.0.1/::1."""
    real = socket.create_connection

    def guarded(address: tuple, *args: Any, **kwargs: Any) -> socket.socket:
        host = address[0]
        if not ipaddress.ip_address(host).is_loopback:
            raise AssertionError(f"test tried to connect to {host}: only loopback is allowed")
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", guarded)


@pytest.fixture
def http_server() -> Iterator[HttpServer]:
    server = HttpServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def black_hole() -> Iterator[BlackHole]:
    hole = BlackHole()
    try:
        yield hole
    finally:
        hole.close()


@pytest.fixture
def provider(settings: Any) -> Callable[..., str]:
    """Configure provider ``test`` (or ``name``) for this test; returns the provider name.

    Defaults suit a local server: 127.0.0.1 allow-listed, short timeouts, fast backoff.
    """
    settings.DURABLE_HTTP_PROVIDERS = {}

    def configure(name: str = TEST_PROVIDER, **keys: Any) -> str:
        values = {
            "allow_hosts": ["127.0.0.1"],
            "connect_timeout": 2,
            "total_timeout": 5,
            "backoff_base": 0.05,
            "backoff_max": 0.2,
            "max_in_flight": 0,
        }
        values.update(keys)
        settings.DURABLE_HTTP_PROVIDERS = {**settings.DURABLE_HTTP_PROVIDERS, name: values}
        return name

    return configure


@pytest.fixture
def make_client() -> Iterator[Callable[..., Any]]:
    """``make_client("test", resolver=…)``: a client of its own, closed at teardown."""
    from durable.http.client import HttpClient
    from durable.http.config import provider_config

    made: list[HttpClient] = []

    def build(name: str = TEST_PROVIDER, **kwargs: Any) -> HttpClient:
        made.append(HttpClient(provider_config(name), **kwargs))
        return made[-1]

    yield build
    for client in made:
        client.close()


def provider_env(**providers: dict[str, Any]) -> dict[str, str]:
    """Environment for worker subprocesses: the same provider settings as JSON."""
    return {"DURABLE_HTTP_PROVIDERS": json.dumps(providers)}


@pytest.fixture(autouse=True)
def fresh_clients() -> Iterator[None]:
    """Each test gets new long-lived clients (no pooled connection from a previous test)."""
    yield
    with http_client._clients_lock:
        for existing in http_client._clients.values():
            existing.close()
        http_client._clients.clear()


# --- SMTP -------------------------------------------------------------------------------


@dataclass
class Mail:
    mail_from: str
    rcpt_tos: list[str]
    content: bytes
    at: float

    def header(self, name: str) -> str | None:
        from email import message_from_bytes

        return message_from_bytes(self.content).get(name)


@dataclass
class SmtpServer:
    """aiosmtpd on 127.0.0.1, port 0, in its own event loop thread; ``replies`` scripts DATA.

    A reply ``"drop"`` takes the message and hangs up before answering (the
    client cannot know it was taken). ``logins`` (user → password) turns on
    AUTH LOGIN/PLAIN without TLS (loopback only) and records every attempt.
    """

    messages: list[Mail] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)  # e.g. "451 try later"; then "250 OK"
    port: int = 0
    logins: dict[str, str] | None = None
    # (user, accepted). Not "auth_…": aiosmtpd takes handler attributes so named for
    # AUTH mechanisms.
    logins_seen: list[tuple[str, bool]] = field(default_factory=list)

    def start(self) -> None:
        from aiosmtpd.smtp import SMTP

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

        options: dict[str, Any] = {}
        if self.logins is not None:
            options = {
                "authenticator": self._authenticate,
                "auth_required": True,  # nothing is accepted without the password
                # Loopback only: no TLS to set up. aiosmtpd warns about it (UserWarning):
                # tests using this mark it ignored.
                "auth_require_tls": False,
            }

        async def serve() -> Any:
            return await self._loop.create_server(
                lambda: SMTP(self, hostname="localhost", loop=self._loop, **options),
                "127.0.0.1",
                0,
            )

        self._server = asyncio.run_coroutine_threadsafe(serve(), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]

    def _authenticate(
        self, server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any
    ) -> Any:
        from aiosmtpd.smtp import AuthResult, LoginPassword

        if not isinstance(auth_data, LoginPassword):
            return AuthResult(success=False, handled=False)
        user = auth_data.login.decode()
        accepted = (self.logins or {}).get(user) == auth_data.password.decode()
        self.logins_seen.append((user, accepted))
        return AuthResult(success=accepted)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        mail = Mail(envelope.mail_from, list(envelope.rcpt_tos), envelope.content, time.time())
        if self.replies:
            answer = self.replies.pop(0)
            if answer == "drop":
                self.messages.append(mail)
                server.transport.close()
                return "250 OK"  # never reaches the client
            if not answer.startswith("250"):
                return answer
        self.messages.append(mail)
        return "250 OK"

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


SMTP_USER = "notify-bot"
# Django 6.1 configures mail as MAILERS (EMAIL_* warns there); 5.2 knows only EMAIL_*.
MAILERS = django.VERSION >= (6, 1)


def use_mailer(settings: Any, backend: str, **options: Any) -> None:
    """The default mailer for this test, in the form this Django line takes."""
    if MAILERS:
        settings.MAILERS = {"default": {"BACKEND": backend, "OPTIONS": options}}
        return
    settings.EMAIL_BACKEND = backend
    for name, value in options.items():
        setattr(settings, f"EMAIL_{'HOST_USER' if name == 'username' else name.upper()}", value)


def _serve_smtp(settings: Any, logins: dict[str, str] | None) -> Iterator[SmtpServer]:
    server = SmtpServer(logins=logins)
    server.start()
    use_mailer(
        settings,
        "django.core.mail.backends.smtp.EmailBackend",
        host="127.0.0.1",
        port=server.port,
        timeout=5,
    )
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def smtp_server(settings: Any) -> Iterator[SmtpServer]:
    yield from _serve_smtp(settings, None)


@pytest.fixture
def smtp_login_server(settings: Any) -> Iterator[SmtpServer]:
    """Requires AUTH: ``server.logins = {SMTP_USER: password}`` before the test sends."""
    yield from _serve_smtp(settings, {})


def smtp_env(server: SmtpServer) -> dict[str, str]:
    return {
        "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "EMAIL_HOST": "127.0.0.1",
        "EMAIL_PORT": str(server.port),
        "EMAIL_TIMEOUT": "5",
    }
