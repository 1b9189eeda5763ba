"""Shared fixtures: real worker subprocesses against the test database, and waiting helpers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import pgbouncer, traces

BASE_DIR = Path(__file__).resolve().parent.parent
# A developer's own deployment settings must not leak into tests (a worker
# started by a test would otherwise ingest the real recovery-events.jsonl).
HOST_ONLY_VARIABLES = (
    "RECOVERY_EVENTS_FILE",
    "WEKAN_FERRETDB_SQLITE_DIR",
    "FERRETDB_SQLITE_DIR",
    "WEKAN_SQLITE_DIR",
    "RECOVERY_INGEST_INTERVAL",
    "RECOVERY_IMPORT_DIRS",
    "DURABLE_RETENTION",
    "DURABLE_RETENTION_CRON",
    "FILE_STORAGES",
    "DURABLE_FAULTS",
    "DURABLE_LISTEN_URL",
    "DISABLE_SERVER_SIDE_CURSORS",
)
for _name in HOST_ONLY_VARIABLES:
    os.environ.pop(_name, None)


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout}s: {predicate}")
        time.sleep(interval)


def database_url(*, direct: bool = False) -> str:
    """The URL of the database the tests run on (pytest-django's test database).

    Through the PgBouncer the tests are routed through, if any (``tests.pgbouncer``),
    unless ``direct``.
    """
    from django.db import connection

    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings['NAME']}"
    bouncer = pgbouncer.routed_to()
    if bouncer is not None and not direct:
        return bouncer.url(settings["NAME"])
    user = settings.get("USER") or "postgres"
    password = f":{settings['PASSWORD']}" if settings.get("PASSWORD") else ""
    host = settings.get("HOST") or "127.0.0.1"
    port = settings.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{settings['NAME']}"


class Workers:
    """Starts ``manage.py runworker`` subprocesses; kills whatever is left at teardown."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []

    def env(self, faults: str = "", **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="tests.settings",
            DATABASE_URL=database_url(),
            DURABLE_FAULTS=faults,
            PYTHONUNBUFFERED="1",
            **extra,
        )
        return env

    def start(
        self,
        *args: str,
        faults: str = "",
        lease: float = 1.0,
        burst: bool = False,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen:
        cmd = [sys.executable, "manage.py", "runworker", "--lease-seconds", str(lease)]
        cmd += ["--poll-interval", "0.05", *args]
        if burst:
            cmd.append("--burst")
        log = open(self.log_dir / f"worker-{len(self.procs)}.log", "w")  # noqa: SIM115 - closed at teardown
        proc = subprocess.Popen(
            cmd, cwd=BASE_DIR, env={**self.env(faults), **(env or {})}, stdout=log, stderr=log
        )
        proc.log_path = log.name  # type: ignore[attr-defined]
        proc.log_file = log  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def run(self, *args: str, timeout: float = 60.0, **kwargs: Any) -> subprocess.Popen:
        """Start a ``--burst`` worker and wait for it to exit."""
        proc = self.start(*args, burst=True, **kwargs)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"worker did not finish in {timeout}s:\n{self.log(proc)}")
        return proc

    @staticmethod
    def log(proc: subprocess.Popen) -> str:
        proc.log_file.flush()  # type: ignore[attr-defined]
        return Path(proc.log_path).read_text()  # type: ignore[attr-defined]

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()  # SIGKILL also ends a SIGSTOPped process
            proc.wait(timeout=10)
            proc.log_file.close()  # type: ignore[attr-defined]


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(tmp_path)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def spans() -> Iterator[Any]:
    """A real OpenTelemetry SDK provider for the test, recording to memory."""
    exporter = traces.in_memory()
    try:
        yield exporter
    finally:
        traces.uninstall()


# --- through PgBouncer ----------------------------------------------------------------------


@pytest.fixture(scope="session")
def pgbouncer_server(django_db_setup, django_db_blocker) -> Iterator[pgbouncer.PgBouncer]:
    """One PgBouncer per test process, in front of the test database (PostgreSQL only).

    After ``django_db_setup``, so it is stopped before the test database is dropped
    (a pooler holding server connections to it would make the drop fail).
    """
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("PgBouncer pools PostgreSQL only")
    bouncer = pgbouncer.PgBouncer().start()
    try:
        yield bouncer
    finally:
        bouncer.close()


@pytest.fixture
def through_pgbouncer(pgbouncer_server: pgbouncer.PgBouncer) -> Iterator[pgbouncer.PgBouncer]:
    """Worker subprocesses and live servers of this test connect through PgBouncer, with
    the configuration the "Behind PgBouncer" how-to gives (wake-ups on a direct connection)."""
    with pgbouncer.routed(pgbouncer_server, listen_url=database_url(direct=True)):
        yield pgbouncer_server


@pytest.fixture(scope="session", autouse=True)
def _whole_run_through_pgbouncer(request: pytest.FixtureRequest) -> Iterator[None]:
    """``TEST_PGBOUNCER=1``: every test's processes through PgBouncer (PostgreSQL runs)."""
    if not os.environ.get("TEST_PGBOUNCER") or "postgres" not in os.environ.get("DATABASE_URL", ""):
        yield
        return
    bouncer = request.getfixturevalue("pgbouncer_server")
    with pgbouncer.routed(bouncer, listen_url=database_url(direct=True)):
        yield
