"""Pure decisions about requests: headers, bodies, query strings, cursors and SSE frames.

No ORM, no settings, no clock: everything a function needs is passed in, so
``tests/unit/test_api_parse.py`` pins each rule down with a table.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from typing import Any, TypeVar

from ..rules import priority_problem, queue_name_problem
from ..schedules.timing import CatchUp, normalise_cron, parse_interval
from ..schedules.timing import time_zone as check_time_zone
from ..states import JobState, OnRestart
from .errors import FieldError, Refusal, invalid

MAX_IDEMPOTENCY_KEY = 255
MAX_OPERATION_NAME = 100
MAX_SCHEDULE_NAME = 100
# RFC 6750 b64token; anything else after "Bearer " is malformed.
B64TOKEN = re.compile(r"^[A-Za-z0-9\-._~+/]+=*$")
VISIBLE_ASCII = re.compile(r"^[\x21-\x7e]+$")
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
MAX_ID = 2**63 - 1  # BIGINT: a larger id cannot exist and must not reach the database
SUBMISSION_FIELDS = ("operation", "input", "queue", "priority", "on_restart")
BATCH_FIELDS = ("operation", "inputs", "queue", "priority", "on_restart")
MAX_BATCH_JOBS = 1000  # jobs per POST /jobs/batch (the body limit applies too)
SCHEDULE_FIELDS = (
    "name", "operation", "cron", "interval", "input", "time_zone", "catch_up", "overlap",
    "queue", "priority", "enabled",
)  # fmt: skip
HTTP_WHITESPACE = " \t"  # RFC 9110 OWS

LIST_DEFAULT_LIMIT, LIST_MAX_LIMIT = 50, 200
EVENTS_DEFAULT_LIMIT, EVENTS_MAX_LIMIT = 100, 1000


# --- headers ------------------------------------------------------------------------


def _media_types(header: str) -> list[tuple[str, dict[str, str]]]:
    result = []
    for part in header.split(","):
        pieces = [p.strip() for p in part.split(";")]
        if not pieces[0]:
            continue
        params = {}
        for param in pieces[1:]:
            name, _, value = param.partition("=")
            params[name.strip().lower()] = value.strip().strip('"')
        result.append((pieces[0].lower(), params))
    return result


def is_json_content_type(header: str | None) -> bool:
    """``application/json``, optionally ``; charset=utf-8`` (any other charset is refused)."""
    types = _media_types(header or "")
    if len(types) != 1:
        return False
    media, params = types[0]
    return media == "application/json" and params.get("charset", "utf-8").lower() in {
        "utf-8",
        "utf8",
    }


def wants_event_stream(accept: str | None) -> bool:
    """True when the client lists ``text/event-stream`` (with a non-zero q) in Accept."""
    for media, params in _media_types(accept or ""):
        if media == "text/event-stream":
            try:
                return float(params.get("q", "1")) > 0
            except ValueError:
                return True
    return False


def parse_bearer(header: str | None) -> tuple[str | None, str | None]:
    """``(token, None)``, or ``(None, problem)``: "missing-token" or "malformed-header"."""
    if header is None or not header.strip():
        return None, "missing-token"
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or not B64TOKEN.match(token):
        return None, "malformed-header"
    return token, None


def parse_idempotency_key(value: str | None) -> str | None:
    """The key from an ``Idempotency-Key`` header (None when absent).

    The IETF draft makes the header a structured-field string (``"abc"``); plain
    ``abc`` is what most clients send. Both mean the key ``abc``.
    """
    if value is None:
        return None
    key = value.strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    if not key or len(key) > MAX_IDEMPOTENCY_KEY or not VISIBLE_ASCII.match(key):
        raise invalid(
            [
                FieldError(
                    "header.Idempotency-Key",
                    f"must be 1 to {MAX_IDEMPOTENCY_KEY} visible ASCII characters",
                )
            ],
            "the Idempotency-Key header is not usable",
        )
    return key


def parse_last_event_id(value: str | None) -> int | None:
    """The seq in a ``Last-Event-ID`` header; empty means none (as for an absent header).

    Only spaces and tabs around it are dropped: they are HTTP's optional
    whitespace, not part of the value.
    """
    text = (value or "").strip(HTTP_WHITESPACE)
    if text == "":
        return None
    return _non_negative_int(text, "header.Last-Event-ID")


# --- bodies -------------------------------------------------------------------------


def _pairs_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads_json_object(body: bytes) -> dict[str, Any]:
    """Parse a request body that must be one JSON object; refuse anything ambiguous.

    Duplicate keys are refused (two parsers could disagree on which one wins, and
    the idempotency digest must mean one thing), as are NaN and Infinity.
    """
    if not body.strip():
        raise Refusal(400, "malformed_json", "the request body is empty; send a JSON object")
    try:
        text = body.decode("utf-8")
        data = json.loads(
            text, object_pairs_hook=_pairs_without_duplicates, parse_constant=_no_constants
        )
    except UnicodeDecodeError:
        raise Refusal(400, "malformed_json", "the request body is not UTF-8") from None
    except RecursionError:
        raise Refusal(400, "malformed_json", "the request body is nested too deeply") from None
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise Refusal(400, "malformed_json", f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise Refusal(400, "malformed_json", "the request body must be a JSON object")
    return data


def json_numbers(value: Any) -> Any:
    """``value`` with every integral float as an int: in JSON ``1.0`` and ``1`` are one number.

    Called on cleaned input (``durable.sanitize`` bounds its depth), so recursion is safe.
    """
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: json_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [json_numbers(item) for item in value]
    return value


def canonical_json(data: Any) -> str:
    return json.dumps(json_numbers(data), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_digest(method: str, path: str, data: Any) -> str:
    """What "the same request" means for an idempotency key: method, path, parsed body.

    Whitespace, key order and how a number is written (``1`` or ``1.0``) do not
    change it; any value does. ``POST /jobs`` passes ``Submission.fields()`` of
    the submission with its defaults filled in, so ``"priority": null``, an
    absent priority and the operation's own priority are the same request too.
    """
    text = f"{method.upper()} {path}\n{canonical_json(data)}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_Options = TypeVar("_Options", "Submission", "BatchSubmission")


def _with_defaults(submission: _Options, *, queue: str, priority: int, on_restart: str) -> _Options:
    """A (batch) submission with every None option replaced by the operation's value."""
    return replace(
        submission,
        queue=submission.queue or queue,
        priority=priority if submission.priority is None else submission.priority,
        on_restart=submission.on_restart or str(on_restart),
    )


@dataclass(frozen=True)
class Submission:
    """A parsed ``POST /jobs`` body; None: the operation's default (``with_defaults``)."""

    operation: str
    input: dict[str, Any] = field(default_factory=dict)
    queue: str | None = None
    priority: int | None = None
    on_restart: str | None = None

    def with_defaults(self, *, queue: str, priority: int, on_restart: str) -> Submission:
        """Every None replaced by the operation's value, as ``enqueue`` would."""
        return _with_defaults(self, queue=queue, priority=priority, on_restart=on_restart)

    def fields(self) -> dict[str, Any]:
        return asdict(self)


def _priority(value: Any, errors: list[FieldError]) -> int | None:
    if value is None:
        return None
    problem = priority_problem(value)
    if problem is not None:
        errors.append(FieldError("priority", problem))
        return None
    return int(value)  # 5.0 is the number 5 in JSON


def _queue(value: Any, errors: list[FieldError]) -> str | None:
    if value is None:
        return None
    problem = queue_name_problem(value)
    if problem is not None:
        errors.append(FieldError("queue", problem))
        return None
    return str(value)


def _operation(value: Any, errors: list[FieldError]) -> str:
    """The ``operation`` of a submission or a schedule: required, a name of bounded length."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_OPERATION_NAME:
        errors.append(
            FieldError("operation", f"required: a string of 1 to {MAX_OPERATION_NAME} characters")
        )
        return ""
    return value


def _unknown_fields(data: Mapping[str, Any], allowed: Sequence[str]) -> list[FieldError]:
    return [
        FieldError(name, f"unknown field; allowed: {', '.join(allowed)}")
        for name in data
        if name not in allowed
    ]


def parse_submission(data: Mapping[str, Any]) -> Submission:
    """Check the fields of ``POST /jobs``; every problem is reported, not just the first."""
    errors = _unknown_fields(data, SUBMISSION_FIELDS)
    operation = _operation(data.get("operation"), errors)
    job_input = data.get("input", {})
    if job_input is None:
        job_input = {}
    if not isinstance(job_input, dict):
        errors.append(FieldError("input", "must be a JSON object"))
    queue = _queue(data.get("queue"), errors)
    priority = _priority(data.get("priority"), errors)
    on_restart = data.get("on_restart")
    if on_restart is not None and on_restart not in OnRestart.values:
        errors.append(FieldError("on_restart", f"must be one of {', '.join(OnRestart.values)}"))
    if errors:
        raise invalid(errors)
    return Submission(operation, job_input, queue, priority, on_restart)


@dataclass(frozen=True)
class BatchSubmission:
    """A parsed ``POST /jobs/batch`` body: one operation, many inputs, shared options."""

    operation: str
    inputs: list[dict[str, Any]]
    queue: str | None = None
    priority: int | None = None
    on_restart: str | None = None

    def with_defaults(self, *, queue: str, priority: int, on_restart: str) -> BatchSubmission:
        """Every None replaced by the operation's value, as ``enqueue_many`` would."""
        return _with_defaults(self, queue=queue, priority=priority, on_restart=on_restart)

    def fields(self) -> dict[str, Any]:
        return asdict(self)


def parse_batch(data: Mapping[str, Any]) -> BatchSubmission:
    """Check the fields of ``POST /jobs/batch``; every problem is reported, not just the first."""
    errors = _unknown_fields(data, BATCH_FIELDS)
    operation = _operation(data.get("operation"), errors)
    inputs = data.get("inputs")
    if not isinstance(inputs, list) or not 0 < len(inputs) <= MAX_BATCH_JOBS:
        errors.append(FieldError("inputs", f"must be an array of 1 to {MAX_BATCH_JOBS} inputs"))
        inputs = []
    inputs = [{} if item is None else item for item in inputs]
    errors.extend(
        FieldError(f"inputs[{index}]", "must be a JSON object")
        for index, item in enumerate(inputs)
        if not isinstance(item, dict)
    )
    queue = _queue(data.get("queue"), errors)
    priority = _priority(data.get("priority"), errors)
    on_restart = data.get("on_restart")
    if on_restart is not None and on_restart not in OnRestart.values:
        errors.append(FieldError("on_restart", f"must be one of {', '.join(OnRestart.values)}"))
    if errors:
        raise invalid(errors)
    return BatchSubmission(operation, inputs, queue, priority, on_restart)


@dataclass(frozen=True)
class ScheduleSpec:
    """A parsed ``POST /schedules`` body, in the terms of ``schedules.service.add_schedule``."""

    name: str
    operation: str
    cron: str | None = None
    every: timedelta | None = None
    input: dict[str, Any] = field(default_factory=dict)
    time_zone: str = ""
    catch_up: str = CatchUp.LATEST.value
    overlap: bool = False
    queue: str = ""
    priority: int | None = None
    enabled: bool = True


KIND_NAMES = {str: "a string", bool: "true or false", dict: "a JSON object"}


def _optional(data: Mapping[str, Any], name: str, kind: type, errors: list[FieldError]) -> Any:
    """``data[name]`` if absent, null or exactly of ``kind`` (True is no int, 1 no bool)."""
    value = data.get(name)
    if value is None or type(value) is kind:
        return value
    errors.append(FieldError(name, f"must be {KIND_NAMES[kind]} or null"))
    return None


def _schedule_name(value: Any, errors: list[FieldError]) -> str:
    """The stripped name, or "" after adding the error.

    The service's rule (schedules.service._fields), checked here so that what the
    service refuses later is about the input alone.
    """
    name = value.strip() if isinstance(value, str) else ""
    if not 0 < len(name) <= MAX_SCHEDULE_NAME or any(ch.isspace() and ch != " " for ch in name):
        why = f"required: 1 to {MAX_SCHEDULE_NAME} characters, no tabs or newlines"
        errors.append(FieldError("name", why))
        return ""
    return name


def parse_schedule(data: Mapping[str, Any]) -> ScheduleSpec:
    """Check the fields of ``POST /schedules``: types and shapes here, meaning in the service.

    Exactly one of ``cron`` (5 fields or a macro) and ``interval`` (``90s``, ``15m``,
    ``1h``, ``1d``, ``2w``; a bare number is seconds). Null means the default.
    """
    errors = _unknown_fields(data, SCHEDULE_FIELDS)
    name = _schedule_name(data.get("name"), errors)
    operation = _operation(data.get("operation"), errors)
    cron = _optional(data, "cron", str, errors)
    interval = _optional(data, "interval", str, errors)
    every = None
    if (cron is None) == (interval is None) and not any(
        e.field in ("cron", "interval") for e in errors
    ):
        errors.append(FieldError("cron", "give a cron expression or an interval (exactly one)"))
    elif interval is not None:
        try:
            every = parse_interval(interval)
        except ValueError as exc:
            errors.append(FieldError("interval", str(exc)))
    elif cron is not None:
        try:
            normalise_cron(cron)
        except ValueError as exc:
            errors.append(FieldError("cron", str(exc)))
    job_input = _optional(data, "input", dict, errors) or {}
    time_zone = (_optional(data, "time_zone", str, errors) or "").strip()
    if time_zone:
        try:
            check_time_zone(time_zone)
        except ValueError as exc:
            errors.append(FieldError("time_zone", str(exc)))
    catch_up = data.get("catch_up")
    if catch_up is not None and catch_up not in {c.value for c in CatchUp}:
        errors.append(FieldError("catch_up", "must be latest or skip"))
    overlap = _optional(data, "overlap", bool, errors)
    enabled = _optional(data, "enabled", bool, errors)
    queue = _queue(data.get("queue"), errors)
    priority = _priority(data.get("priority"), errors)
    if errors:
        raise invalid(errors)
    return ScheduleSpec(
        name=name,
        operation=operation,
        cron=cron,
        every=every,
        input=job_input,
        time_zone=time_zone,
        catch_up=catch_up or CatchUp.LATEST.value,
        overlap=bool(overlap),
        queue=queue or "",
        priority=priority,
        enabled=True if enabled is None else enabled,
    )


def parse_schedule_patch(data: Mapping[str, Any]) -> bool:
    """``PATCH /schedules/<id>``: ``{"enabled": true|false}``, the one thing to change."""
    errors = _unknown_fields(data, ("enabled",))
    enabled = data.get("enabled")
    if not isinstance(enabled, bool):
        errors.append(FieldError("enabled", "required: true or false"))
    elif not errors:
        return enabled
    raise invalid(errors)


# --- query strings -------------------------------------------------------------------


def _non_negative_int(text: str, name: str, *, maximum: int = MAX_ID) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 19 or int(text) > maximum:
        raise invalid([FieldError(name, f"must be an integer from 0 to {maximum}")])
    return int(text)


def _single(
    params: Mapping[str, Sequence[str]], name: str, *, empty_is_absent: bool = False
) -> str | None:
    """The parameter's one value. ``empty_is_absent``: ``name=`` means no value at all,
    as an HTML form (or a URL template with a blank) sends an unused filter."""
    values = params.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise invalid([FieldError(f"query.{name}", "give it once")])
    if empty_is_absent and values[0] == "":
        return None
    return values[0]


def _reject_unknown(params: Mapping[str, Sequence[str]], allowed: Sequence[str]) -> None:
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise invalid(
            [
                FieldError(f"query.{name}", f"unknown parameter; allowed: {', '.join(allowed)}")
                for name in unknown
            ]
        )


def _limit(params: Mapping[str, Sequence[str]], default: int, maximum: int) -> int:
    text = _single(params, "limit")
    if text is None:
        return default
    value = _non_negative_int(text, "query.limit", maximum=maximum)
    if value < 1:
        raise invalid([FieldError("query.limit", f"must be an integer from 1 to {maximum}")])
    return value


def encode_cursor(before_id: int) -> str:
    """Opaque to clients: they pass back what they got, so the format can change later."""
    raw = f"v1:{before_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    bad = invalid([FieldError("query.cursor", "is not a cursor this API issued")])
    if not cursor or len(cursor) > 40:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise bad from None
    version, _, number = raw.partition(":")
    if version != "v1" or not number.isdigit() or not 0 < int(number) <= MAX_ID:
        raise bad
    return int(number)


def _operation_filter(params: Mapping[str, Sequence[str]]) -> str | None:
    """``?operation=``: one name of printable characters; empty means no filter."""
    operation = _single(params, "operation", empty_is_absent=True)
    if operation is not None and not (
        len(operation) <= MAX_OPERATION_NAME and operation.isprintable()
    ):
        raise invalid(
            [
                FieldError(
                    "query.operation", f"must be 1 to {MAX_OPERATION_NAME} printable characters"
                )
            ]
        )
    return operation


def _cursor(params: Mapping[str, Sequence[str]]) -> int | None:
    """``?cursor=``: the id a page continues below (``decode_cursor``); empty means none."""
    cursor = _single(params, "cursor", empty_is_absent=True)
    return decode_cursor(cursor) if cursor is not None else None


@dataclass(frozen=True)
class ListQuery:
    states: tuple[str, ...] = ()
    operation: str | None = None
    before_id: int | None = None
    limit: int = LIST_DEFAULT_LIMIT


def parse_list_query(params: Mapping[str, Sequence[str]]) -> ListQuery:
    """``state`` (repeatable or comma-separated), ``operation``, ``cursor``, ``limit``.

    An empty ``state``, ``operation`` or ``cursor`` is no filter, so
    ``?state=&operation=&cursor=`` lists everything; ``limit`` must be a number.
    """
    _reject_unknown(params, ("state", "operation", "cursor", "limit"))
    states: list[str] = []
    for value in params.get("state", []):
        if value.strip(" ") == "":
            continue
        for name in value.split(","):
            name = name.strip(" ")
            if name not in JobState.values:
                raise invalid(
                    [FieldError("query.state", f"must be one of {', '.join(JobState.values)}")]
                )
            if name not in states:
                states.append(name)
    operation = _operation_filter(params)
    before_id = _cursor(params)
    return ListQuery(
        tuple(states), operation, before_id, _limit(params, LIST_DEFAULT_LIMIT, LIST_MAX_LIMIT)
    )


@dataclass(frozen=True)
class ScheduleListQuery:
    operation: str | None = None
    before_id: int | None = None
    limit: int = LIST_DEFAULT_LIMIT


def parse_schedule_list_query(params: Mapping[str, Sequence[str]]) -> ScheduleListQuery:
    """``operation``, ``cursor``, ``limit``; empty ``operation`` or ``cursor``: absent."""
    _reject_unknown(params, ("operation", "cursor", "limit"))
    operation = _operation_filter(params)
    before_id = _cursor(params)
    return ScheduleListQuery(
        operation, before_id, _limit(params, LIST_DEFAULT_LIMIT, LIST_MAX_LIMIT)
    )


@dataclass(frozen=True)
class EventsQuery:
    after: int = 0
    limit: int = EVENTS_DEFAULT_LIMIT


def parse_events_query(
    params: Mapping[str, Sequence[str]], last_event_id: str | None = None
) -> EventsQuery:
    """``after`` (a seq) and ``limit``; a ``Last-Event-ID`` header wins over ``after``.

    An SSE client reconnecting sends the header with the last id it saw, while
    its URL still carries the ``after`` it started with.
    """
    _reject_unknown(params, ("after", "limit"))
    resumed = parse_last_event_id(last_event_id)
    text = _single(params, "after")
    after = _non_negative_int(text, "query.after") if text is not None else 0
    if resumed is not None:
        after = resumed
    return EventsQuery(after, _limit(params, EVENTS_DEFAULT_LIMIT, EVENTS_MAX_LIMIT))


# --- server-sent events -------------------------------------------------------------


def sse_event(data: str, *, event_id: int | None = None, event: str | None = None) -> str:
    """One SSE frame. ``data`` is compact JSON, so it never contains a line break."""
    lines = []
    if event_id is not None:
        lines.append(f"id: {event_id}")
    if event is not None:
        lines.append(f"event: {event}")
    lines.extend(f"data: {line}" for line in data.split("\n"))
    return "\n".join(lines) + "\n\n"


def sse_comment(text: str) -> str:
    return f": {text}\n\n"


def sse_retry(milliseconds: int) -> str:
    return f"retry: {int(milliseconds)}\n\n"


def find_unstorable(value: Any) -> str | None:
    """Where parsed JSON holds a character no database column can keep, or None.

    NUL (U+0000): PostgreSQL cannot store it in text or jsonb. An unpaired
    surrogate (``"\\ud800"`` is valid JSON): it has no UTF-8 encoding at all.
    Refusing both here turns what would be a database or encoding error into
    a precise 400. Iterative, so a deeply nested body cannot exhaust the stack.
    """
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if UNSTORABLE.search(item):
                return path or "body"
        elif isinstance(item, dict):
            for key, child in item.items():
                if UNSTORABLE.search(key):
                    return path or "body"
                stack.append((f"{path}.{key}" if path else key, child))
        elif isinstance(item, list):
            stack.extend((f"{path}[{index}]", child) for index, child in enumerate(item))
    return None
