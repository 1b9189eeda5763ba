"""Input validation and form fields shared by the built-in database operations.

Every check raises ``InputRejected(field, why)`` with the field's name, so the
dashboard can put the message beside the field and the command can print it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from django import forms
from django.conf import settings

from ..errors import InputRejected
from .tables import PlanError, TableError, parse_exclude, plan_for, same_database, site_tables

MAX_BATCH_SIZE = 100_000
MAX_UNIQUE_KEY = 255


def reject_unknown(data: Mapping[str, Any], allowed: Iterable[str]) -> None:
    known = set(allowed)
    for key in data:
        if key not in known:
            raise InputRejected(key, f"unknown field; expected one of: {', '.join(sorted(known))}")


def database_alias(data: Mapping[str, Any], name: str, default: str | None = "default") -> str:
    value = data.get(name) or default
    if not value:
        raise InputRejected(name, "required: the alias of a database in settings.DATABASES")
    if not isinstance(value, str) or value not in settings.DATABASES:
        aliases = ", ".join(sorted(settings.DATABASES))
        raise InputRejected(name, f"no database alias {value!r} (configured: {aliases})")
    return value


def bounded_key(key: str) -> str:
    """A unique key as it is, or — too long for the column — its prefix and a digest.

    Never simply cut: two long keys that share their first 255 characters must
    stay two keys.
    """
    if len(key) <= MAX_UNIQUE_KEY:
        return key
    digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()
    return f"{key[: MAX_UNIQUE_KEY - len(digest) - 1]}#{digest}"


def database_write_key(alias: str) -> str:
    """The unique key of jobs that write into ``alias``'s tables (restores, copies).

    One such job at a time per database: two writers replacing the same tables
    would delete each other's rows. Aliases that reach the same database (same
    engine, name, host and port) share the key.
    """
    same = sorted(other for other in settings.DATABASES if same_database(alias, other))
    return bounded_key(f"database-write:{same[0] if same else alias}")


def batch_size(data: Mapping[str, Any], default: int) -> int:
    value = data.get("batch_size", default)
    if value in (None, ""):
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BATCH_SIZE:
        raise InputRejected("batch_size", f"must be an integer from 1 to {MAX_BATCH_SIZE:,}")
    return value


def check_tables(alias: str, excluded: list[str]) -> None:
    """Refuse at enqueue what would fail later: a table that cannot be handled, or no order."""
    try:
        plan_for(site_tables(alias, excluded))
    except (PlanError, TableError) as exc:
        raise InputRejected("exclude", f"{exc}; exclude it") from None


def flag(data: Mapping[str, Any], name: str) -> bool:
    value = data.get(name, False)
    if not isinstance(value, bool):
        raise InputRejected(name, "must be true or false")
    return value


def exclude(data: Mapping[str, Any]) -> list[str]:
    value = data.get("exclude") or []
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise InputRejected("exclude", "must be a list of app labels or app_label.model names")
    try:
        return parse_exclude(value)
    except ValueError as exc:
        raise InputRejected("exclude", str(exc)) from None


# --- form fields --------------------------------------------------------------------------


def database_choices() -> list[tuple[str, str]]:
    return [(alias, alias) for alias in settings.DATABASES]


class ExcludeField(forms.CharField):
    """Comma-separated ``app_label`` or ``app_label.model`` names; cleans to a list."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault(
            "help_text", "Comma-separated apps or models to leave out, e.g. sessions, auth.group"
        )
        super().__init__(**kwargs)

    def clean(self, value: Any) -> list[str]:
        text = super().clean(value) or ""
        try:
            return parse_exclude(text.split(","))
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None


def batch_size_field(default: int, help_text: str) -> forms.IntegerField:
    return forms.IntegerField(
        min_value=1, max_value=MAX_BATCH_SIZE, initial=default, required=False, help_text=help_text
    )
