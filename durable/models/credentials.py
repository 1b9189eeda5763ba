"""The encrypted credential table: one Fernet token per credential name.

Written and read only by ``durable.credential_store`` (``manage.py credential``);
the key that decrypts it lives in the workers' environment, never here.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class Credential(models.Model):
    name = models.CharField(max_length=100, unique=True)
    ciphertext = models.TextField(help_text="Fernet token; the key is never in the database.")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.name
