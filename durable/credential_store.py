"""The encrypted credential table: secrets an operator stores with ``manage.py credential``.

Values are encrypted with Fernet (AES-128-CBC + HMAC-SHA256, from
``cryptography``) under ``DURABLE_CREDENTIAL_KEY``. The setting holds one key
or several separated by commas: the first encrypts, all of them decrypt
(``MultiFernet``), so a key is rotated by putting the new one first, running
``manage.py credential rotate`` and then dropping the old one. The database
alone — a backup, a replica, an admin page — never reveals a secret; the key
lives only in the workers' environment.
"""

from __future__ import annotations

from collections.abc import Sequence

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from .errors import Unavailable
from .models import Credential
from .policy import MIN_SECRET_CHARS, secret_problem


def configured_keys() -> list[str]:
    value = getattr(settings, "DURABLE_CREDENTIAL_KEY", "") or ""
    items = value.split(",") if isinstance(value, str) else list(value)
    return [item.strip() for item in items if item and item.strip()]


def cipher(keys: Sequence[str] | None = None) -> MultiFernet:
    """The cipher for ``keys`` (default: the setting); Unavailable if there is no valid key."""
    keys = configured_keys() if keys is None else list(keys)
    if not keys:
        raise Unavailable(
            "DURABLE_CREDENTIAL_KEY is not set: the encrypted credential table cannot be used "
            "(generate a key with `python manage.py credential generate-key`)"
        )
    try:
        return MultiFernet([Fernet(key.encode()) for key in keys])
    except ValueError:
        raise Unavailable(
            "DURABLE_CREDENTIAL_KEY is not a valid Fernet key (32 url-safe base64-encoded bytes)"
        ) from None


def encrypt(value: str, keys: Sequence[str] | None = None) -> str:
    return cipher(keys).encrypt(value.encode("utf-8")).decode("ascii")


def decrypt(token: str, keys: Sequence[str] | None = None) -> str:
    return cipher(keys).decrypt(token.encode("ascii")).decode("utf-8")


def validate_secret(value: str) -> str:
    """What ``store`` accepts: what ``credentials.resolve`` would use unchanged."""
    if len(value) < MIN_SECRET_CHARS:
        raise ValueError(f"a secret must be at least {MIN_SECRET_CHARS} characters")
    if value != value.strip():
        raise ValueError("a secret must not start or end with whitespace")
    problem = secret_problem(value)
    if problem is not None:
        raise ValueError(f"a secret cannot be used: {problem}")
    return value


def store(name: str, value: str) -> bool:
    """Encrypt and save ``value`` under ``name``; True if it was new."""
    token = encrypt(validate_secret(value))
    now = timezone.now()
    with transaction.atomic():
        _, created = Credential.objects.update_or_create(
            name=name, defaults={"ciphertext": token, "updated_at": now}
        )
    return created


def delete(name: str) -> bool:
    deleted, _ = Credential.objects.filter(name=name).delete()
    return bool(deleted)


def rotate() -> int:
    """Re-encrypt every value under the first key; returns how many rows were rewritten."""
    fernet = cipher()
    count = 0
    for row in Credential.objects.order_by("pk"):
        try:
            token = fernet.rotate(row.ciphertext.encode("ascii")).decode("ascii")
        except InvalidToken:
            raise Unavailable(
                f"credential {row.name!r} cannot be decrypted with any configured key; "
                "add the key it was stored with to DURABLE_CREDENTIAL_KEY before rotating"
            ) from None
        Credential.objects.filter(pk=row.pk).update(ciphertext=token, updated_at=timezone.now())
        count += 1
    return count


def lookup(name: str) -> str | None:
    """The decrypted value of ``name``, None if there is no such row."""
    row = Credential.objects.filter(name=name).values_list("ciphertext", flat=True).first()
    if row is None:
        return None
    try:
        return decrypt(row)
    except InvalidToken:
        raise Unavailable(
            f"credential {name!r} is stored but cannot be decrypted with DURABLE_CREDENTIAL_KEY "
            "(was the key replaced without keeping the old one?); store it again or restore "
            "the key, then resume the job"
        ) from None
