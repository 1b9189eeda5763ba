"""Helpers for tests that run a whole other Django site in subprocesses (its own database)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings


def run(
    cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 240, stderr: bool = False
) -> str:
    """Run a command to completion; its output (with ``stderr``, both streams), or the
    test fails with all it printed."""
    done = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr if stderr else done.stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def postgres(statement: str) -> None:
    """One statement on the test server's maintenance database (CREATE/DROP DATABASE)."""
    import psycopg

    default = settings.DATABASES["default"]
    with psycopg.connect(
        dbname="postgres",
        user=default["USER"] or "postgres",
        password=default["PASSWORD"] or None,
        host=default["HOST"] or "127.0.0.1",
        port=default["PORT"] or 5432,
        autocommit=True,
    ) as conn:
        conn.execute(statement)  # type: ignore[arg-type]


def on_postgres() -> bool:
    return settings.DATABASES["default"]["ENGINE"] != "django.db.backends.sqlite3"


def own_database(suffix: str) -> str:
    """A PostgreSQL database for the other site, named after this run's test database."""
    return f"{settings.DATABASES['default']['TEST']['NAME']}_{suffix}"


@contextlib.contextmanager
def runserver(
    manage: list[str], cwd: Path, env: dict[str, str], log: Path, first: str, **client: Any
) -> Iterator[tuple[httpx.Client, httpx.Response]]:
    """``manage.py runserver`` on a free loopback port, and a client once ``first`` answers.

    Yields the client and that first response; the server is stopped afterwards.
    """
    port = free_port()
    with log.open("w") as output:
        server = subprocess.Popen(
            [*manage, "runserver", "--noreload", f"127.0.0.1:{port}"],
            cwd=cwd,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10, **client) as http:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        response = http.get(first)
                        break
                    except httpx.TransportError:
                        assert server.poll() is None, log.read_text()
                        assert time.monotonic() < deadline, f"no answer\n{log.read_text()}"
                        time.sleep(0.2)
                yield http, response
        finally:
            server.terminate()
            server.wait(timeout=10)
