"""A worker's name: ``prefix:random``, fresh for every process start."""

from __future__ import annotations

import os
import secrets
import socket

MAX_WORKER_ID_PREFIX = 150  # leaves room for the suffix in the 200-character lease_owner


def default_worker_id(prefix: str | None = None) -> str:
    """``prefix:random`` (default prefix ``host:pid``), fresh for every process start.

    A restarted pod or container started with the same ``--worker-id`` never
    inherits the dead process's identity: its leases, its registry row, its
    "stopped" mark. 48 random bits keep a crash-looping pod clear of collisions
    with the rows its earlier starts left behind.
    """
    prefix = prefix or f"{socket.gethostname()}:{os.getpid()}"
    return f"{prefix[:MAX_WORKER_ID_PREFIX]}:{secrets.token_hex(6)}"
