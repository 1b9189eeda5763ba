"""Helpers for tests that run a whole other Django site in subprocesses (its own database)."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 240) -> str:
    """Run a command to completion; its output, or the test fails with all it printed."""
    done = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stdout}\n{done.stderr}"
    return done.stdout


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


def first_answer(
    client: httpx.Client, path: str, alive: Callable[[], bool], log: Path, timeout: float = 30
) -> Any:
    """GET ``path`` once the server started in a subprocess accepts connections."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return client.get(path)
        except httpx.TransportError:
            assert alive(), log.read_text()
            assert time.monotonic() < deadline, f"the server did not start\n{log.read_text()}"
            time.sleep(0.2)
