"""Create the first administrator if there is none, and say how to log in."""

from __future__ import annotations

import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from recovery.settings import VAR_DIR


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
        password = os.environ.get("ADMIN_PASSWORD")
        where = "ADMIN_PASSWORD"
        if not password:
            password = secrets.token_urlsafe(12)
            path = VAR_DIR / "admin-password"
            VAR_DIR.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(password + "\n")
            where = str(path)
        users.objects.create_superuser(username=username, email="", password=password)
        self.stdout.write(
            self.style.SUCCESS(f"Created administrator {username!r}; the password is in {where}.")
        )
