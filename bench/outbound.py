"""What the safe outbound client costs per request, against raw httpx in the same run.

    python bench/outbound.py [--requests N]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_issue3 python bench/outbound.py

A keep-alive HTTP server on 127.0.0.1 answers "ok". Measured, one thread,
sequential requests on one pooled connection:

1. baseline: a bare ``httpx.Client`` GET loop;
2. ``durable.http`` without gates (SSRF guard, deadline on every socket
   operation, bounded streaming read, verdicts);
3. with the in-flight gate (two short database transactions per request:
   pass the gate and free the slot);
4. with the in-flight gate and min spacing 0 ms across 4 threads (gate contention).

Prints requests/s and the ratio to the baseline; the gate's cost is the
database's commit latency, so it differs between SQLite and PostgreSQL.
"""

from __future__ import annotations

import argparse
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from _setup import configure


class Ok(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        # One write: headers and body in separate segments would meet Nagle's
        # algorithm and the client's delayed ACK (a 40 ms stall per request).
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    def log_message(self, *args: object) -> None:
        pass


def rate(send, count: int, threads: int = 1) -> float:
    def loop(n: int) -> None:
        from django.db import connection

        for _ in range(n):
            send()
        connection.close()  # each thread has its own database connection

    workers = [threading.Thread(target=loop, args=(count // threads,)) for _ in range(threads)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return (count // threads) * threads / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    count = parser.parse_args().requests
    url = configure("bench-outbound.sqlite3")

    import httpx

    from durable.http.client import HttpClient
    from durable.http.config import build

    server = ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    target = f"http://127.0.0.1:{server.server_address[1]}/"

    raw = httpx.Client(trust_env=False)
    plain = HttpClient(build("bench", {"allow_hosts": ["127.0.0.1"], "max_in_flight": 0}))
    gated = HttpClient(build("bench-gated", {"allow_hosts": ["127.0.0.1"], "max_in_flight": 8}))

    def gated_send() -> None:
        gated.request("GET", target)

    for send in (lambda: raw.get(target), lambda: plain.request("GET", target), gated_send):
        rate(send, 50)  # warm up connections and code paths
    baseline = rate(lambda: raw.get(target), count)
    results = {
        "durable.http, no gate": rate(lambda: plain.request("GET", target), count),
        "durable.http, in-flight gate": rate(lambda: gated.request("GET", target), count),
        "durable.http, gate, 4 threads": rate(gated_send, count, threads=4),
    }
    print(f"database: {url.split('@')[-1]}")
    print(f"requests: {count} sequential GETs to 127.0.0.1 (keep-alive)")
    print(f"{'raw httpx':32s} {baseline:9.0f} req/s  1.00x  {1000 / baseline:6.3f} ms/req")
    for name, value in results.items():
        print(
            f"{name:32s} {value:9.0f} req/s  {value / baseline:4.2f}x  {1000 / value:6.3f} ms/req"
        )
    server.shutdown()


if __name__ == "__main__":
    main()
