"""The one exception API code raises to refuse a request; views render it as problem+json."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class FieldError:
    field: str  # "priority", "input.units", "query.limit", "header.Idempotency-Key"
    message: str


class Refusal(Exception):
    """A precise 4xx: ``code`` is stable for programs, ``detail`` is for people.

    RFC 9457 problem details, with our ``code`` and per-field ``errors`` as extensions.
    """

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        errors: Sequence[FieldError] = (),
        headers: dict[str, str] | None = None,
        extra: dict[str, object] | None = None,
    ):
        super().__init__(f"{status} {code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.errors = list(errors)
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})  # more problem-detail members, e.g. the job's state


def invalid(
    errors: Sequence[FieldError], detail: str = "the request has invalid fields"
) -> Refusal:
    return Refusal(400, "invalid_request", detail, errors=errors)


def rejected_input(field: str, reason: str, request_fields: Collection[str]) -> Refusal:
    """An engine's ``InputRejected(field, reason)`` as a 400 naming the field as it was sent.

    The engine names a field of the request itself (``priority``; a schedule's
    ``cron``…) or of the operation's input; only the request's own fields, and
    ``input`` as a whole, keep their name — anything else is ``input.<field>``.
    """
    name = field if field == "input" or field in request_fields else f"input.{field}"
    return invalid([FieldError(name, reason)])
