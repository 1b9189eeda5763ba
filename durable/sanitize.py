"""Input validation on enqueue: JSON only, bounded, and never a credential.

A job row is read by dashboards, APIs, logs and backups; a secret copied into
it leaks through all of them. Operations receive credentials by *reference*
(a name such as ``"token_ref": "github"``) and resolve them at run time.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
from typing import Any

from .errors import InputRejected

REFERENCE_SUFFIXES = ("_ref", "_reference", "_credential")
REFERENCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$")
SECRET_WORDS = frozenset(
    {
        "password", "passwd", "passphrase", "pwd", "secret", "secrets", "token", "apikey",
        "auth", "authorization", "bearer", "cookie", "cookies", "credential", "credentials",
        "privatekey", "accesskey", "secretkey", "signingkey", "sessionid", "clientsecret",
    }
)  # fmt: skip
SECRET_PAIRS = frozenset(
    {
        ("api", "key"), ("private", "key"), ("access", "key"), ("secret", "key"),
        ("signing", "key"), ("session", "id"), ("client", "secret"), ("auth", "header"),
    }
)  # fmt: skip
CREDENTIAL_VALUE = re.compile(
    r"(^\s*(bearer|basic|token)\s+\S{8,})|(-----BEGIN [A-Z ]*PRIVATE KEY-----)|"
    r"(^(ghp|gho|ghs|github_pat|xox[abpr]|sk_live|sk-[A-Za-z0-9]{2,}|AKIA)[A-Za-z0-9_\-]{8,})",
    re.IGNORECASE,
)
MAX_DEPTH = 32


@functools.lru_cache(maxsize=4096)
def looks_like_credential_key(key: str) -> bool:
    """Token-wise, so ``max_tokens`` or ``author`` pass but ``apiKey`` and ``db_password`` don't.

    Cached: every input is checked twice (before and after the operation's own
    ``clean_input``), and the inputs of one operation repeat the same few keys —
    ``enqueue_many`` spent a quarter of its time here, splitting them anew.
    """
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).lower()
    words = [word for word in re.split(r"[^a-z0-9]+", snake) if word]
    if any(word in SECRET_WORDS for word in words):
        return True
    if any(pair in SECRET_PAIRS for pair in itertools.pairwise(words)):
        return True
    return any(word.endswith(("password", "passwd", "secret", "token", "apikey")) for word in words)


def is_reference_key(key: str) -> bool:
    return key.lower().endswith(REFERENCE_SUFFIXES)


def _storable_text(text: str, where: str) -> None:
    """PostgreSQL's jsonb cannot hold NUL, and no database can hold half a surrogate pair."""
    if "\x00" in text:
        raise InputRejected(where, "contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputRejected(where, "is not valid Unicode (an unpaired surrogate)") from None


def _check(value: Any, path: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise InputRejected(path or "input", f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InputRejected(path or "input", "object keys must be strings")
            _storable_text(key, path or "input")
            where = f"{path}.{key}" if path else key
            if is_reference_key(key):
                if not (isinstance(item, str) and REFERENCE_NAME.match(item)):
                    raise InputRejected(
                        where,
                        "a credential reference must be a name (letters, digits, _ . : -), "
                        "not the secret itself",
                    )
                continue
            if looks_like_credential_key(key):
                raise InputRejected(
                    where,
                    f"looks like a credential; pass a reference instead, e.g. "
                    f'"{key}_ref": "<name>", and store the secret in server configuration',
                )
            _check(item, where, depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check(item, f"{path}[{index}]", depth + 1)
    elif isinstance(value, str):
        _storable_text(value, path or "input")
        if CREDENTIAL_VALUE.search(value):
            raise InputRejected(path or "input", "the value looks like a secret; pass a reference")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise InputRejected(path or "input", "NaN and Infinity are not JSON")
    elif value is not None and not isinstance(value, bool | int):
        raise InputRejected(path or "input", f"{type(value).__name__} is not a JSON value")


def clean_input(value: Any, *, max_bytes: int) -> dict[str, Any]:
    """Return ``value`` if it is a safe JSON object, else raise InputRejected."""
    return clean_and_encode(value, max_bytes=max_bytes)[0]


def clean_and_encode(value: Any, *, max_bytes: int) -> tuple[dict[str, Any], str]:
    """``clean_input``, also returning the JSON text it measured: what the row stores.

    The size check encodes the input anyway; ``enqueue`` writes that text rather
    than encoding the same value again for the database.
    """
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise InputRejected("input", "must be a JSON object")
    _check(value, "", 0)
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if size > max_bytes:
        raise InputRejected("input", f"is {size} bytes; the limit is {max_bytes}")
    return value, text
