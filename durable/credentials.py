"""Resolve credential references (names) to secrets at run time.

Jobs store only the name. Resolvers are tried in order (setting
``DURABLE_CREDENTIAL_RESOLVERS``, dotted paths of ``callable(name) -> str | None``);
the defaults read ``settings.DURABLE_CREDENTIALS``, then the environment
variable ``DURABLE_CREDENTIAL_<NAME>`` (name upper-cased, other characters as ``_``),
then the encrypted credential table (``durable.credential_store``, managed with
``python manage.py credential``).
A name no resolver knows raises ``Unavailable``: the job pauses with a reason
that tells the operator what to set, instead of failing.

Every value is checked wherever it came from, the same way the encrypted
table checks what it stores: surrounding whitespace (the newline of
``$(cat token-file)``) is stripped, and a value that is too short to redact,
too long, or holds a control character is refused — a secret shorter than 4
characters is never redacted from messages, and one with a control character
makes the HTTP library fail with an error that quotes the header verbatim.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from django.conf import settings
from django.utils.module_loading import import_string

from .credential_store import lookup
from .errors import Unavailable
from .policy import secret_problem

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
    return lookup(name)


def _resolvers() -> list[Callable[[str], str | None]]:
    paths = getattr(settings, "DURABLE_CREDENTIAL_RESOLVERS", DEFAULT_RESOLVERS)
    return [import_string(path) for path in paths]


def _source(resolver: Callable[[str], str | None], name: str) -> str:
    if resolver is from_settings:
        return f"DURABLE_CREDENTIALS[{name!r}]"
    if resolver is from_environment:
        return f"the environment variable {env_name(name)}"
    if resolver is from_database:
        return "the encrypted credential table"
    return f"the resolver {getattr(resolver, '__qualname__', resolver)!s}"


def resolve(name: str) -> str:
    """The secret ``name`` refers to, stripped and checked; ``Unavailable`` if none is usable."""
    for resolver in _resolvers():
        raw = resolver(name)
        if not raw:
            continue
        if not isinstance(raw, str):
            raise Unavailable(f"credential {name!r} from {_source(resolver, name)} is not text")
        value = raw.strip()
        problem = secret_problem(value)
        if problem is not None:
            raise Unavailable(
                f"credential {name!r} from {_source(resolver, name)} cannot be used: {problem}; "
                "set it again, then resume the job"
            )
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
