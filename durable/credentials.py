"""Resolve credential references (names) to secrets at run time.

Jobs store only the name. Resolvers are tried in order (setting
``DURABLE_CREDENTIAL_RESOLVERS``, dotted paths of ``callable(name) -> str | None``);
the defaults read ``settings.DURABLE_CREDENTIALS``, then the environment
variable ``DURABLE_CREDENTIAL_<NAME>`` (name upper-cased, other characters as ``_``),
then the encrypted credential table (``durable.credential_store``, managed with
``python manage.py credential``).
A name no resolver knows raises ``Unavailable``: the job pauses with a reason
that tells the operator what to set, instead of failing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from django.conf import settings
from django.utils.module_loading import import_string

from .errors import Unavailable

DEFAULT_RESOLVERS = (
    "durable.credentials.from_settings",
    "durable.credentials.from_environment",
    "durable.credentials.from_database",
)


def env_name(name: str) -> str:
    return "DURABLE_CREDENTIAL_" + re.sub(r"[^A-Za-z0-9]", "_", name).upper()


def from_settings(name: str) -> str | None:
    return (getattr(settings, "DURABLE_CREDENTIALS", None) or {}).get(name)


def from_environment(name: str) -> str | None:
    return os.environ.get(env_name(name)) or None


def from_database(name: str) -> str | None:
    from .credential_store import lookup

    return lookup(name)


def _resolvers() -> list[Callable[[str], str | None]]:
    paths = getattr(settings, "DURABLE_CREDENTIAL_RESOLVERS", DEFAULT_RESOLVERS)
    return [import_string(path) for path in paths]


def resolve(name: str) -> str:
    for resolver in _resolvers():
        value = resolver(name)
        if value:
            return value
    raise Unavailable(
        f"credential {name!r} is not configured: set the environment variable "
        f"{env_name(name)} (or DURABLE_CREDENTIALS[{name!r}]) on the workers, or store it with "
        f"`python manage.py credential set {name}`, then resume the job"
    )


def is_available(name: str) -> bool:
    try:
        resolve(name)
    except Unavailable:
        return False
    return True
