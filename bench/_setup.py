"""Shared start-up for benchmarks: a scratch database that is not the site's own."""

from __future__ import annotations

import os
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent


def configure(default_sqlite: str) -> str:
    """Point Django at DATABASE_URL if set, else at a fresh SQLite file; migrate it."""
    sys.path.insert(0, str(BASE_DIR))
    if "DATABASE_URL" not in os.environ:
        path = BASE_DIR / "var" / default_sqlite
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        os.environ["DATABASE_URL"] = f"sqlite:///{path}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recovery.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    return os.environ["DATABASE_URL"]
