"""API test fixtures: clients with tokens, an in-process HTTP client, and a real gunicorn.

Every response the ``api`` and ``live`` clients receive is checked against
the OpenAPI document the server publishes (status documented, media type
documented, body valid against its schema), so the document cannot drift
from the views without a test failing.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections

from durable.api.models import Client
from durable.api.openapi import build_document
from durable.api.tokens import new_token
from tests.conftest import BASE_DIR, database_url, wait_until

DOCUMENT = build_document("/api/")


@pytest.fixture(scope="session")
def openapi_schema():
    return schemathesis.openapi.from_dict(DOCUMENT)


def check_response(schema, response: httpx.Response) -> None:
    """Fail unless ``response`` is what the OpenAPI document promises for its request."""
    request = response.request
    response.read()
    operation = schema.find_operation_by_path(request.method, request.url.path)
    content_type = response.headers.get("content-type", "").split(";")[0]
    if operation is None:
        # Not a documented path/method pair: only the generic refusals may answer.
        assert response.status_code in (404, 405), (request.method, request.url, response.text)
        assert content_type == "application/problem+json"
        return
    definition = operation.responses.find_by_status_code(response.status_code)
    assert definition is not None, (
        f"{request.method} {request.url.path} answered {response.status_code}, "
        f"which the OpenAPI document does not list: {response.text[:500]}"
    )
    status = str(response.status_code)
    responses = DOCUMENT["paths"][operation.path][request.method.lower()]["responses"]
    documented = responses.get(status, {}).get("content", {})
    if response.content or documented:
        assert content_type in documented, (status, content_type, list(documented))
    operation.validate_response(response)


def component_validator(name: str) -> jsonschema_rs.Validator:
    """A JSON Schema 2020-12 validator for ``#/components/schemas/<name>`` of the document."""
    root = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "components": DOCUMENT["components"],
        "$ref": f"#/components/schemas/{name}",
    }
    return jsonschema_rs.Draft202012Validator(root)


def sse_events(text: str) -> list[dict[str, str]]:
    """The events an SSE client dispatches from ``text`` (WHATWG HTML "server-sent events").

    Fields of one frame up to a blank line; comment lines (``:``) skipped; a frame
    without ``data`` is not an event (the ``retry`` frame); ``id`` is the last id seen
    on the connection; ``event`` defaults to ``message``.
    """
    events, frame, data, last_id = [], {}, [], None
    for line in [*text.replace("\r\n", "\n").split("\n"), ""]:
        if line.startswith(":"):
            continue
        if line:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                data.append(value)
            elif name == "id":
                last_id = value
            else:
                frame[name] = value
            continue
        if data:
            event = {"event": frame.get("event") or "message", "data": "\n".join(data)}
            if last_id is not None:
                event["id"] = last_id
            events.append(event)
        frame, data = {}, []
    return events


OWN_TOKEN = object()


class Api:
    """An httpx client that sends the token and checks every response against the document."""

    def __init__(self, http: httpx.Client, schema: Any, token: str | None = None):
        self.http = http
        self.schema = schema
        self.token = token

    def request(
        self, method: str, path: str, *, token: Any = OWN_TOKEN, **kwargs: Any
    ) -> httpx.Response:
        """``token=None`` sends no Authorization header; a string sends that token."""
        headers = dict(kwargs.pop("headers", None) or {})
        token = self.token if token is OWN_TOKEN else token
        if token is not None:
            headers.setdefault("Authorization", f"Bearer {token}")
        response = self.http.request(method, path, headers=headers, **kwargs)
        check_response(self.schema, response)
        return response

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def patch(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("PATCH", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("DELETE", path, **kwargs)

    def with_token(self, token: str | None) -> Api:
        return Api(self.http, self.schema, token)


def wsgi_handler() -> WSGIHandler:
    """The site's WSGI handler with its whole middleware stack.

    WhiteNoise warns when ``collectstatic`` has not run (``make test`` never
    runs it, and the API serves no static files).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "No directory at", UserWarning)
        return WSGIHandler()


@pytest.fixture
def make_client(db):
    """Factory: ``make_client(name, scopes)`` -> (Client row, token)."""

    def make(name: str = "ci", scopes: tuple[str, ...] = ("jobs:read", "jobs:write")):
        token = new_token()
        client = Client.objects.create(
            name=name, scopes=list(scopes), token_prefix=token.prefix, token_hash=token.hash
        )
        return client, token.token

    return make


@pytest.fixture
def api(openapi_schema, make_client) -> Iterator[Api]:
    """In-process: Django's WSGI handler behind httpx, in the test's own transaction."""
    # As django.test.Client does: closing "old" connections at the end of each
    # request would close the test's connection in the middle of its transaction.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    _, token = make_client()
    transport = httpx.WSGITransport(app=wsgi_handler(), remote_addr="192.0.2.7")
    with httpx.Client(transport=transport, base_url="http://testserver") as http:
        try:
            yield Api(http, openapi_schema, token)
        finally:
            request_started.connect(close_old_connections)
            request_finished.connect(close_old_connections)


class Server:
    """gunicorn with the project's ``gunicorn.conf.py`` (gthread workers and the access-log
    format of ``make run`` and production) on a socket the test owns.

    The test binds 127.0.0.1:0 and hands the listening socket to gunicorn, so a
    stop and a start keep the same address: a restart between two requests is
    just ``server.stop(); server.start()``.
    """

    def __init__(
        self, log_dir: Path, env: dict[str, str], workers: int = 2, threads: int | None = None
    ):
        self.workers, self.threads = workers, threads
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.set_inheritable(True)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.log_path = log_dir / "gunicorn.log"
        self.extra_env = env
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="tests.settings",
            DATABASE_URL=database_url(),
            PYTHONUNBUFFERED="1",
            LOG_LEVEL="DEBUG",
            **self.extra_env,
        )
        fd = self.sock.fileno()
        cmd = [sys.executable, "-m", "gunicorn", "-c", str(BASE_DIR / "gunicorn.conf.py")]
        cmd += ["recovery.wsgi", "--bind", f"fd://{fd}", "--workers", str(self.workers)]
        if self.threads is not None:
            cmd += ["--threads", str(self.threads)]
        cmd += ["--timeout", "60", "--graceful-timeout", "5"]
        cmd += ["--error-logfile", "-", "--log-level", "debug"]
        log = open(self.log_path, "a")  # noqa: SIM115 - handed to the child, closed below
        self.proc = subprocess.Popen(
            cmd, cwd=BASE_DIR, env=env, stdout=log, stderr=log, pass_fds=[fd],
            start_new_session=True,
        )  # fmt: skip
        log.close()
        self.starts += 1
        wait_until(self._ready, timeout=30, interval=0.1)

    def _ready(self) -> bool:
        assert self.proc is not None
        assert self.proc.poll() is None, self.log()
        try:
            return httpx.get(f"{self.url}/api/openapi.json", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)  # the group of the gunicorn we started
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc = None

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def close(self) -> None:
        self.stop(signal.SIGKILL)
        self.sock.close()


@pytest.fixture
def live_server_factory(tmp_path: Path) -> Iterator:
    """Factory: ``live_server_factory(**env)`` starts a gunicorn; all are killed at teardown."""
    servers: list[Server] = []

    def start(*, workers: int = 2, threads: int | None = None, **env: str) -> Server:
        server = Server(tmp_path, env, workers, threads)
        servers.append(server)
        server.start()
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.close()


@pytest.fixture
def live(openapi_schema, live_server_factory, make_client):
    """A started gunicorn and an ``Api`` client for it (read and write, jobs and schedules)."""
    server = live_server_factory()
    _, token = make_client("live", ("jobs:read", "jobs:write", "schedules:read", "schedules:write"))
    with httpx.Client(base_url=server.url, timeout=30) as http:
        api = Api(http, openapi_schema, token)
        api.server = server  # type: ignore[attr-defined]
        yield api
