"""The API served by a real gunicorn (gunicorn.conf.py: gthread workers) on 127.0.0.1, with workers.

``transaction=True`` everywhere: the server and the workers are other
processes with their own connections, so the test's rows must really commit.
"""

from __future__ import annotations

import contextlib
import io
import json
import socket
import time

import httpx
import pytest
from django.core.management import call_command
from django.db import connection

from durable import jobs
from durable.api.models import IdempotencyKey
from durable.api.tokens import hash_token
from durable.models import Job
from tests.conftest import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

NOOP = {"operation": "durable.noop", "input": {"units": 1}}


def test_submit__committed_before_202_and_replayed_after_a_restart(live):
    headers = {"Authorization": f"Bearer {live.token}", "Idempotency-Key": "release-7"}
    with live.http.stream("POST", "/api/jobs", json=NOOP, headers=headers) as response:
        # Only the status line and headers have arrived: the job they name is already
        # visible through the test's own connection (another process's commit).
        assert response.status_code == 202
        job_id = int(response.headers["Location"].rsplit("/", 1)[1])
        assert Job.objects.get(pk=job_id).state == "queued"
        response.read()
    first = response
    assert first.json()["id"] == job_id

    live.server.stop()  # SIGTERM: the process and its memory are gone
    live.server.start()
    assert live.server.starts == 2

    again = live.post("/api/jobs", json=NOOP, headers={"Idempotency-Key": "release-7"})
    assert again.status_code == 202
    assert again.content == first.content
    assert again.headers["Idempotent-Replayed"] == "true"
    other = live.post(
        "/api/jobs",
        json={**NOOP, "input": {"units": 2}},
        headers={"Idempotency-Key": "release-7"},
    )
    assert other.status_code == 422
    assert Job.objects.count() == 1
    assert IdempotencyKey.objects.count() == 1


class SseClient:
    """What a browser's EventSource does: follow, reconnect with Last-Event-ID, stop on 204."""

    def __init__(self, http: httpx.Client, url: str, token: str):
        self.http, self.url, self.token = http, url, token
        self.last_id: str | None = None
        self.connections = 0
        self.ids: list[int] = []
        self.end: dict | None = None

    def follow(self, *, stop_after: int | None = None) -> int:
        """One connection; returns its status. ``stop_after``: hang up after that many events."""
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "text/event-stream"}
        if self.last_id is not None:
            headers["Last-Event-ID"] = self.last_id
        self.connections += 1
        received = 0
        with self.http.stream("GET", self.url, headers=headers) as response:
            if response.status_code != 200:
                return response.status_code
            assert response.headers["content-type"].startswith("text/event-stream")
            frame: dict[str, str] = {}
            for line in response.iter_lines():
                if line:
                    name, _, value = line.partition(":")
                    frame[name] = value.removeprefix(" ")
                    continue
                if "id" in frame:
                    self.last_id = frame["id"]
                    self.ids.append(int(frame["id"]))
                    received += 1
                if frame.get("event") == "end":
                    self.end = json.loads(frame["data"])
                frame = {}
                if stop_after is not None and received >= stop_after:
                    return 200  # hang up mid-stream, as a client that lost its network
        return 200


def test_events_stream__resumes_from_last_event_id_while_a_worker_produces_events(
    live_server_factory, workers, make_client
):
    # Short streams so the server's time limit cuts in while the job still runs.
    server = live_server_factory(
        DURABLE_API_STREAM_SECONDS="1.5",
        DURABLE_API_STREAM_POLL_SECONDS="0.1",
        DURABLE_API_STREAM_KEEPALIVE_SECONDS="0.5",
    )
    _, token = make_client("watcher")
    with httpx.Client(base_url=server.url, timeout=30) as http:
        submitted = http.post(
            "/api/jobs",
            json={"operation": "test.ticks", "input": {"units": 8, "sleep": 0.4}},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert submitted.status_code == 202
        job_id = submitted.json()["id"]
        workers.start()
        # Both events exist before the first connection, so a worker slow to start on a
        # loaded machine cannot let the 1.5 s stream end after one of them.
        wait_until(lambda: Job.objects.get(pk=job_id).events.count() >= 2)
        sse = SseClient(http, f"/api/jobs/{job_id}/events", token)
        assert sse.follow(stop_after=2) == 200  # we hang up after two events
        assert sse.ids == [1, 2]
        deadline = time.monotonic() + 60
        while sse.end is None and time.monotonic() < deadline:
            assert sse.follow() == 200  # reconnect with Last-Event-ID, as EventSource does
        assert sse.end == {"state": "completed", "last_event_seq": 11}
        # enqueued, started, 8 ticks, completed: every seq exactly once, in order.
        assert sse.ids == list(range(1, 12))
        assert sse.connections >= 3  # ours, and at least one cut by the time limit
        assert sse.follow() == 204  # finished, nothing after the last id: stop reconnecting
    log = server.log()
    assert " 500 " not in log


def test_tokens__never_in_clear_in_the_database_or_the_logs(live, caplog):
    out = io.StringIO()
    call_command("create_api_client", "deployer", "--scope", "jobs:write", stdout=out)
    token = out.getvalue().strip()
    secret = token[len("dur_0123456789ab_") :]  # the secret may contain "_" itself
    near_miss = token[:-1] + ("A" if token[-1] != "A" else "B")
    with caplog.at_level("DEBUG"):
        assert live.post("/api/jobs", json=NOOP, token=token).status_code == 202
        assert live.get("/api/jobs", token=token).status_code == 403
        assert live.get("/api/jobs", token=near_miss).status_code == 401
        assert live.get("/api/jobs", token=secret).status_code == 401
        bad_header = live.get("/api/jobs", token=None, headers={"Authorization": f"Basic {token}"})
        assert bad_header.status_code == 401
        # curl -u "$TOKEN:": a real Basic header, base64("<token>:"), which gunicorn's
        # default access-log format decodes and logs as the user name (%(u)s).
        assert live.get("/api/jobs", token=None, auth=(token, "")).status_code == 401
    # A token pasted into the query string: refused, and neither gunicorn's access log
    # nor Django's request log writes the query string. (Outside caplog: httpx, the
    # client here, logs the URLs it requests.)
    assert live.get(f"/api/jobs?access_token={token}", token=None).status_code == 401
    assert live.get(f"/api/jobs?access_token={token}").status_code == 400

    dump = dump_database()
    assert hash_token(token) in dump  # the scan does read the clients table…
    assert token.split("_")[1] in dump  # …whose public prefix is there
    for text, where in (
        (dump, "database"),
        (live.server.log(), "server log"),
        (caplog.text, "log"),
    ):
        assert secret not in text, where
        assert near_miss[len("dur_0123456789ab_") :] not in text, where
    # The server's log is not empty: the scan looked at real request lines.
    assert '"GET /api/jobs HTTP/1.1" 401' in live.server.log()


def dump_database() -> str:
    """Every row of every table, as text."""
    parts = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")  # noqa: S608 - names from introspection
            parts.extend(repr(row) for row in cursor.fetchall())
    return "\n".join(parts)


def raw_request(url: str, request: bytes) -> bytes:
    """Send bytes no well-behaved client would, read the reply.

    ``Connection: close`` is added to the headers: gthread workers keep a
    connection open for the next request, and the reply is read to EOF.
    """
    host, port = url.removeprefix("http://").split(":")
    head, sep, body = request.partition(b"\r\n\r\n")
    request = head + b"\r\nConnection: close" + sep + body
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_hostile_requests__get_precise_refusals_never_a_500(live):
    url, auth = live.server.url, f"Authorization: Bearer {live.token}\r\n".encode()
    body = json.dumps(NOOP).encode()

    def post(headers: bytes, payload: bytes) -> bytes:
        return raw_request(
            url,
            b"POST /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth + headers
            + b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload,
        )  # fmt: skip

    json_type = b"Content-Type: application/json\r\n"
    # A UTF-8 key arrives as Latin-1 text: refused, not mangled into another key.
    assert post(json_type + "Idempotency-Key: ключ\r\n".encode(), body).startswith(b"HTTP/1.1 400")
    # A Content-Length larger than the limit: refused before the body is read.
    huge = raw_request(
        url,
        b"POST /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth + json_type
        + b"Content-Length: 100000000\r\n\r\n{",
    )  # fmt: skip
    assert huge.startswith(b"HTTP/1.1 413"), huge[:200]
    # A chunked body (no Content-Length): 411, not "the request body is empty".
    chunked = raw_request(
        url,
        b"POST /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth + json_type
        + b"Transfer-Encoding: chunked\r\n\r\n"
        + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n",
    )  # fmt: skip
    assert chunked.startswith(b"HTTP/1.1 411"), chunked[:300]
    # Invalid UTF-8 in the body, a lone surrogate escape, a NUL character.
    assert post(json_type, b'{"operation": "\xff"}').startswith(b"HTTP/1.1 400")
    lone = b'{"operation": "durable.noop", "input": {"x": "\\ud800"}}'
    assert post(json_type, lone).startswith(b"HTTP/1.1 400")
    nul = b'{"operation": "durable.noop", "input": {"x": "\\u0000"}}'
    assert post(json_type, nul).startswith(b"HTTP/1.1 400")
    # Query strings with NUL bytes, broken percent-encoding and huge numbers.
    for query in ("operation=%00", "cursor=%ff%fe", "state=%E2%80", "limit=99999999999999999999"):
        response = live.get(f"/api/jobs?{query}")
        assert response.status_code == 400, (query, response.text)
    assert Job.objects.count() == 0  # every hostile submission was refused
    job = jobs.enqueue("durable.noop", {})
    for query in ("after=1&after=2", "after=%00", "after=1e9", "limit=-5"):
        response = live.get(f"/api/jobs/{job.pk}/events?{query}")
        assert response.status_code == 400, (query, response.text)
    assert " 500 " not in live.server.log()


def test_streams__pages_are_served_while_streams_are_open_and_extra_streams_get_503(
    live_server_factory, make_client
):
    # One process with four threads, two of which may stream. Under sync workers the
    # page requests below would wait for a stream to end (up to 30 s).
    server = live_server_factory(
        workers=1,
        threads=4,
        DURABLE_API_MAX_STREAMS="2",
        DURABLE_API_STREAM_SECONDS="30",
        DURABLE_API_STREAM_POLL_SECONDS="0.1",
        DURABLE_API_STREAM_KEEPALIVE_SECONDS="0.2",  # a gone client is noticed fast
    )
    _, token = make_client("followers")
    auth = {"Authorization": f"Bearer {token}"}
    sse = {**auth, "Accept": "text/event-stream"}
    job = jobs.enqueue("durable.noop", {})  # queued, no worker: its stream stays open
    url = f"{server.url}/api/jobs/{job.pk}/events"
    readers = []  # referenced: a reader dropped mid-stream closes its connection
    with contextlib.ExitStack() as open_streams:
        for _ in range(2):
            http = open_streams.enter_context(httpx.Client(timeout=10))
            response = open_streams.enter_context(http.stream("GET", url, headers=sse))
            assert response.status_code == 200
            readers.append(response.iter_lines())
            assert next(readers[-1]) == "retry: 2000"  # streaming, not waiting in a queue
        busy = httpx.get(url, headers=sse, timeout=10)
        assert busy.status_code == 503
        assert busy.json()["code"] == "too_many_streams"
        assert int(busy.headers["Retry-After"]) > 0
        started = time.monotonic()
        assert httpx.get(f"{server.url}/api/jobs", headers=auth, timeout=5).status_code == 200
        assert httpx.get(f"{server.url}/api/jobs/{job.pk}/events", headers=auth).status_code == 200
        login = httpx.get(f"{server.url}/problems/", timeout=5)
        assert login.status_code in (200, 302)
        assert time.monotonic() - started < 5
        # Both streams were open all along: they still deliver (keep-alive comments).
        for reader in readers:
            assert next(line for line in reader if line.startswith(":")) == ": keep-alive"
    # The followers hung up: their slots are free again once the server notices.
    deadline = time.monotonic() + 15
    while True:
        with httpx.Client(timeout=10) as http, http.stream("GET", url, headers=sse) as again:
            if again.status_code == 200:
                break
        assert time.monotonic() < deadline, "the closed streams kept their slots"
        time.sleep(0.2)
    assert " 500 " not in server.log()
