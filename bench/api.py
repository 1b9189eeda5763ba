"""HTTP API request rates against a real gunicorn, relative to a no-database baseline.

    python bench/api.py [--requests N] [--threads T]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_issue6 python bench/api.py

Starts gunicorn with the project's ``gunicorn.conf.py`` (2 gthread workers,
as ``make run``) on 127.0.0.1, creates an API client, and sends N requests of each kind from T
client threads. The baseline, in the same run: ``GET /api/jobs/<id>``, the
cheapest authenticated read (token lookup, one indexed row, Django, HTTP).
Reported: requests/s and the ratio to that baseline for

- submit: ``POST /api/jobs`` (a job and its event, committed before the 202);
- submit+key: the same with a fresh Idempotency-Key each (one more row);
- replay: the same key and body again (a lookup, no write);
- list page 1 and list deep: 50 jobs newest first, from the top and from a
  cursor near the oldest job (keyset pagination: both should cost the same).
"""

from __future__ import annotations

import argparse
import itertools
import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import httpx
from _setup import BASE_DIR, configure


def start_server(database_url: str) -> tuple[subprocess.Popen, socket.socket, str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.set_inheritable(True)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    env = {**os.environ, "DATABASE_URL": database_url, "LOG_LEVEL": "WARNING"}
    env["DJANGO_SETTINGS_MODULE"] = "recovery.settings"
    log = open(BASE_DIR / "var" / "bench-api-gunicorn.log", "w")  # noqa: SIM115 - the child's
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", str(BASE_DIR / "gunicorn.conf.py"),
         "recovery.wsgi", "--bind", f"fd://{sock.fileno()}", "--workers", "2",
         "--log-level", "warning", "--access-logfile", "/dev/null"],
        cwd=BASE_DIR, env=env, pass_fds=[sock.fileno()], stdout=log, stderr=log,
    )  # fmt: skip
    log.close()
    for _ in range(300):
        try:
            if httpx.get(f"{url}/api/openapi.json", timeout=2).status_code == 200:
                return proc, sock, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("gunicorn did not start")


def rate(url: str, token: str, count: int, threads: int, make_request) -> float:
    """Requests/s for ``count`` requests spread over ``threads`` client threads."""
    counter = itertools.count()
    failures: list[str] = []

    def run() -> None:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
            while next(counter) < count:
                method, path, kwargs, expected = make_request()
                response = http.request(method, path, **kwargs)
                if response.status_code != expected:
                    failures.append(f"{method} {path}: {response.status_code} {response.text}")

    workers = [threading.Thread(target=run) for _ in range(threads)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    if failures:
        raise SystemExit(f"{len(failures)} unexpected responses, e.g. {failures[0]}")
    return count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    database_url = configure("bench-api.sqlite3")
    from django.db import connection

    from durable.api.models import Client
    from durable.api.parse import encode_cursor
    from durable.api.tokens import new_token
    from durable.models import Job

    Client.objects.filter(name="bench").delete()
    token = new_token()
    Client.objects.create(
        name="bench", scopes=["jobs:read", "jobs:write"],
        token_prefix=token.prefix, token_hash=token.hash,
    )  # fmt: skip
    first_job = Job.objects.create(operation="durable.noop").pk
    connection.close()
    proc, sock, url = start_server(database_url)
    body = {"operation": "durable.noop", "input": {"units": 1}}
    try:
        n, t = args.requests, args.threads
        one = f"/api/jobs/{first_job}"
        baseline = rate(url, token.token, n, t, lambda: ("GET", one, {}, 200))
        plain = {"json": body}
        results = {
            "submit": rate(url, token.token, n, t, lambda: ("POST", "/api/jobs", plain, 202)),
            "submit+key": rate(
                url, token.token, n, t,
                lambda: ("POST", "/api/jobs",
                         {"json": body, "headers": {"Idempotency-Key": uuid.uuid4().hex}}, 202),
            ),
        }  # fmt: skip
        replay = {"json": body, "headers": {"Idempotency-Key": "bench-replay"}}
        results["replay"] = rate(url, token.token, n, t, lambda: ("POST", "/api/jobs", replay, 202))
        oldest = Job.objects.order_by("pk").values_list("pk", flat=True)[60]
        deep = {"params": {"limit": 50, "cursor": encode_cursor(oldest)}}
        results["list page 1"] = rate(
            url, token.token, n, t, lambda: ("GET", "/api/jobs", {"params": {"limit": 50}}, 200)
        )
        results["list deep"] = rate(url, token.token, n, t, lambda: ("GET", "/api/jobs", deep, 200))
        jobs_total = Job.objects.count()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        sock.close()
    vendor = connection.vendor
    print(f"database: {vendor}; {n} requests per kind, {t} client threads, 2 gunicorn workers")
    print(f"{'baseline (GET one job)':32} {baseline:8.0f} req/s")
    for name, value in results.items():
        print(f"{name:32} {value:8.0f} req/s  {value / baseline:5.2f}x baseline")
    print(f"jobs in the table at the end: {jobs_total}")


if __name__ == "__main__":
    main()
