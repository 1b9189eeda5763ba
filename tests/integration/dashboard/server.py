"""A real gunicorn serving the site on 127.0.0.1 (an ephemeral port) against the test database.

Used by the production-serving tests and the browser tests. The test binds the
socket and hands it to gunicorn, so the port is known before gunicorn starts
and nothing else can take it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from tests.conftest import BASE_DIR, database_url, wait_until


class Gunicorn:
    def __init__(self, log_dir: Path, *, settings: str = "tests.settings", **env: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.set_inheritable(True)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.log_path = log_dir / "gunicorn.log"
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": settings,
            "DATABASE_URL": database_url(),
            "PYTHONUNBUFFERED": "1",
            "LOG_LEVEL": "WARNING",
            **env,
        }
        self.proc: subprocess.Popen | None = None

    def start(self, workers: int = 2) -> Gunicorn:
        fd = self.sock.fileno()
        cmd = [sys.executable, "-m", "gunicorn", "recovery.wsgi", "--bind", f"fd://{fd}",
               "--workers", str(workers), "--timeout", "60", "--graceful-timeout", "5",
               "--access-logfile", "-", "--error-logfile", "-"]  # fmt: skip
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=BASE_DIR, env=self.env, stdout=log, stderr=log, pass_fds=[fd],
                start_new_session=True,
            )  # fmt: skip
        wait_until(self._ready, timeout=30, interval=0.1)
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        assert self.proc.poll() is None, self.log()
        try:
            return httpx.get(f"{self.url}/problems/login/", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the process group we started
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.sock.close()
