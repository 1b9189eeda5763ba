"""Create the first administrator if there is none, and say how to log in.

``make run`` calls it before every start, so it must never fail on a database
that already has users: when the wanted name belongs to an ordinary account, it
says so and changes nothing (promoting whoever holds the name ``admin`` to
superuser would hand the site to them).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

GENERATED_FILE = "admin-password"


class Command(BaseCommand):
    help = (
        "Create a superuser when none exists: ADMIN_USERNAME / ADMIN_PASSWORD from the "
        "environment, or 'admin' with a generated password written to var/admin-password."
    )

    def handle(self, *args: object, **options: object) -> None:
        users = get_user_model()
        if users.objects.filter(is_superuser=True).exists():
            self.stdout.write("An administrator exists; log in at /problems/ with that account.")
            return
        username = os.environ.get("ADMIN_USERNAME", "admin")
        taken = users.objects.filter(**{users.USERNAME_FIELD: username}).first()
        if taken is not None:
            self.stderr.write(
                self.style.WARNING(
                    f"No administrator exists, and the user {username!r} is an ordinary account: "
                    "left unchanged. Set ADMIN_USERNAME to another name and run `make run` "
                    "again, or make that user a superuser yourself (manage.py createsuperuser "
                    "creates another)."
                )
            )
            return
        password = os.environ.get("ADMIN_PASSWORD")
        where = "ADMIN_PASSWORD"
        if not password:
            password = secrets.token_urlsafe(12)
            var_dir = getattr(settings, "VAR_DIR", None) or Path(settings.BASE_DIR) / "var"
            where = str(write_password(Path(var_dir), password))
        users.objects.create_superuser(username=username, email="", password=password)
        self.stdout.write(
            self.style.SUCCESS(f"Created administrator {username!r}; the password is in {where}.")
        )


def write_password(var_dir: Path, password: str) -> Path:
    """The generated password, readable by the server's user only (mode 0600)."""
    path = var_dir / GENERATED_FILE
    var_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(password + "\n")
    os.chmod(path, 0o600)  # an older file keeps its mode through O_TRUNC
    return path
