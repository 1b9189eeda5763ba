"""Client tokens: high-entropy random strings of which the database keeps only a hash.

Format: ``dur_<prefix>_<secret>`` — a 12-hex-digit public *prefix* that finds
the client row by an index lookup, and 256 random bits of *secret*. Because the
token is random and long, a plain SHA-256 is enough (a slow password hash
protects guessable secrets, not random ones) and does not tie the tokens to
``SECRET_KEY``, so rotating that key does not lock every client out.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

TOKEN_PREFIX = "dur_"  # noqa: S105 - the public format marker, not a secret
TOKEN_PATTERN = re.compile(r"^dur_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
# Compared against when the prefix is unknown, so that path costs the same work.
_DUMMY_HASH = hashlib.sha256(b"no such client").hexdigest()


@dataclass(frozen=True)
class NewToken:
    token: str  # shown to the operator once, never stored
    prefix: str
    hash: str


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> NewToken:
    prefix = secrets.token_hex(6)
    token = f"{TOKEN_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
    return NewToken(token=token, prefix=prefix, hash=hash_token(token))


def token_prefix(token: str) -> str | None:
    """The public lookup part of a well-formed token, or None."""
    match = TOKEN_PATTERN.match(token)
    return match.group(1) if match else None


def token_matches(token: str, stored_hash: str | None) -> bool:
    """Constant-time comparison of ``token``'s hash with the stored one."""
    return hmac.compare_digest(hash_token(token), stored_hash or _DUMMY_HASH) and bool(stored_hash)
