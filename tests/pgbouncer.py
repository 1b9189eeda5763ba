"""A real PgBouncer (Debian's ``pgbouncer``) in transaction pooling mode, for tests and benchmarks.

It listens on a free loopback port and pools every database of the local
PostgreSQL (127.0.0.1:5432), as a site with many machines would put it in
front of its database. Its configuration is the one docs/how-to/run-workers.md
gives ("Behind PgBouncer"): ``pool_mode = transaction``, and the ``options``
startup parameter (the site's idle-in-transaction timeout) ignored.

While one is ``routed()``, ``tests.conftest.database_url()`` — the URL every
worker subprocess and live server of the tests gets — points at it, so those
processes go through the pooler; the test process itself stays on a direct
connection (it creates and drops the test databases, which a pooler holding
server connections to them would prevent). ``TEST_PGBOUNCER=1`` routes a
whole run.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

BINARY = "/usr/sbin/pgbouncer"
CONFIG = """\
[databases]
* = host={host} port={port} user=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen_port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
ignore_startup_parameters = options
max_client_conn = 1000
default_pool_size = {pool_size}
server_idle_timeout = 10
"""


def installed() -> str | None:
    return BINARY if os.access(BINARY, os.X_OK) else shutil.which("pgbouncer")


def require() -> str:
    """The binary; skips without one, except under CI (``CI`` set), where it fails."""
    binary = installed()
    if binary is None:
        message = "pgbouncer is not installed (apt-get install pgbouncer)"
        if os.environ.get("CI"):
            pytest.fail(message + "; CI must install it")
        pytest.skip(message)
    return binary


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PgBouncer:
    def __init__(self, *, target_port: int = 5432, pool_size: int = 20) -> None:
        self.binary = require()
        self.target_port = target_port
        self.pool_size = pool_size
        self.port = 0
        self.proc: subprocess.Popen | None = None
        # Readable by the user it drops to when started as root (it refuses to run as root).
        self.dir = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
        self.dir.chmod(0o755)
        self.log_path = self.dir / "pgbouncer.log"

    def start(self) -> PgBouncer:
        self.port = _free_port()
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(
            CONFIG.format(
                host="127.0.0.1",
                port=self.target_port,
                listen_port=self.port,
                pool_size=self.pool_size,
            )
        )
        ini.chmod(0o644)
        cmd = [self.binary]
        if os.geteuid() == 0:
            cmd += ["-u", _unprivileged_user()]
        log = self.log_path.open("a")
        self.proc = subprocess.Popen([*cmd, str(ini)], stdout=log, stderr=log)
        log.close()
        deadline = time.monotonic() + 10
        while True:
            try:
                with psycopg.connect(self.url("postgres"), connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return self
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"pgbouncer did not start:\n{self.log()}") from None
                time.sleep(0.05)

    def url(self, database: str, user: str = "postgres") -> str:
        return f"postgres://{user}@127.0.0.1:{self.port}/{database}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def _unprivileged_user() -> str:
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError("pgbouncer refuses to run as root, and there is no user to run it as")


# --- routing the tests' processes through it ----------------------------------------------

_routed: PgBouncer | None = None
ROUTED_ENVIRONMENT = ("DISABLE_SERVER_SIDE_CURSORS", "DURABLE_LISTEN_URL")


def routed_to() -> PgBouncer | None:
    """The pooler the tests' processes connect through now, if any."""
    return _routed


@contextmanager
def routed(bouncer: PgBouncer, *, listen_url: str = "") -> Iterator[PgBouncer]:
    """Route the tests' processes through ``bouncer``; they inherit the environment set
    here: no server-side cursors, and wake-ups on ``listen_url`` ("": through the pooler)."""
    global _routed
    previous = _routed, {name: os.environ.get(name) for name in ROUTED_ENVIRONMENT}
    _routed = bouncer
    os.environ["DISABLE_SERVER_SIDE_CURSORS"] = "true"
    os.environ["DURABLE_LISTEN_URL"] = listen_url
    try:
        yield bouncer
    finally:
        _routed, saved = previous
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
