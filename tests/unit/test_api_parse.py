"""The API's pure decisions: headers, bodies, query strings, cursors, SSE frames, tokens."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from durable.api import auth, parse, tokens
from durable.api.errors import Refusal
from durable.api.models import Client


def fields(info: pytest.ExceptionInfo) -> list[str]:
    return [error.field for error in info.value.errors]


# --- headers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("application/json", True),
        ("Application/JSON; charset=UTF-8", True),  # media types are case-insensitive
        ('application/json; charset="utf-8"', True),  # quoted parameter value
        ("application/json; charset=latin-1", False),  # we read UTF-8 only
        ("text/plain", False),
        ("application/x-www-form-urlencoded", False),  # what a forged HTML form sends
        ("application/json, text/plain", False),  # a list is not one type
        ("", False),
        (None, False),
    ],
)
def test_is_json_content_type(header, expected):
    assert parse.is_json_content_type(header) is expected


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        ("text/event-stream", True),
        ("application/json, text/event-stream;q=0.5", True),
        ("text/event-stream;q=0", False),  # explicitly not acceptable
        ("text/event-stream;q=abc", True),  # a broken q is ignored, not fatal
        ("application/json", False),
        ("*/*", False),  # curl's default gets JSON
        (None, False),
    ],
)
def test_wants_event_stream(accept, expected):
    assert parse.wants_event_stream(accept) is expected


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("Bearer abc.DEF-123_~+/=", ("abc.DEF-123_~+/=", None)),
        ("bearer tok", ("tok", None)),  # the scheme is case-insensitive
        ("  Bearer   tok  ", ("tok", None)),
        (None, (None, "missing-token")),
        ("", (None, "missing-token")),
        ("Basic dXNlcjpwYXNz", (None, "malformed-header")),  # another scheme
        ("Bearer", (None, "malformed-header")),  # no token
        ("Bearer a b", (None, "malformed-header")),  # a space is not b64token
        ("Bearer tök", (None, "malformed-header")),  # non-ASCII
        ("tok", (None, "malformed-header")),  # token without scheme
    ],
)
def test_parse_bearer(header, expected):
    assert parse.parse_bearer(header) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),  # no header: no idempotency
        ("abc-123", "abc-123"),
        ('"abc-123"', "abc-123"),  # structured-field string form means the same key
        ("  k  ", "k"),
        ("x" * 255, "x" * 255),
    ],
)
def test_parse_idempotency_key__accepts(value, expected):
    assert parse.parse_idempotency_key(value) == expected


@pytest.mark.parametrize(
    "value",
    ["", '""', "x" * 256, "has space", "ключ", "tab\there"],
)
def test_parse_idempotency_key__refuses(value):
    with pytest.raises(Refusal) as info:
        parse.parse_idempotency_key(value)
    assert info.value.status == 400
    assert fields(info) == ["header.Idempotency-Key"]


# --- bodies ------------------------------------------------------------------------------


def test_loads_json_object__returns_the_object():
    assert parse.loads_json_object(b'{"a": [1, 2.5, null, "\\u00e9"]}') == {
        "a": [1, 2.5, None, "é"]
    }


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"", "empty"),
        (b"  \n", "empty"),
        (b"{", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),  # an array is valid JSON but not a request
        (b'"text"', "must be a JSON object"),
        (b'{"a": 1, "a": 2}', "duplicate key"),  # parsers disagree on which wins
        (b'{"a": NaN}', "not valid JSON"),
        (b'{"a": Infinity}', "not valid JSON"),
        (b'{"a": "\xff"}', "not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),  # would exhaust the stack
    ],
)
def test_loads_json_object__refuses(body, why):
    with pytest.raises(Refusal) as info:
        parse.loads_json_object(body)
    assert (info.value.status, info.value.code) == (400, "malformed_json")
    assert why in info.value.detail


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.0, 1),
        (-0.0, 0),
        (1.5, 1.5),
        (1e20, 10**20),
        ({"a": [2.0, {"b": 3.0}], "c": "4.0"}, {"a": [2, {"b": 3}], "c": "4.0"}),  # not strings
        (True, True),  # a bool is not a number here
    ],
)
def test_json_numbers(value, expected):
    result = parse.json_numbers(value)
    assert result == expected
    assert json.dumps(result) == json.dumps(expected)  # the type too: 1, not 1.0


def test_request_digest__one_number_however_written():
    assert parse.request_digest("POST", "jobs", {"n": 1}) == parse.request_digest(
        "POST", "jobs", {"n": 1.0}
    )
    assert parse.request_digest("POST", "jobs", {"n": 1}) != parse.request_digest(
        "POST", "jobs", {"n": 1.5}
    )


def test_submission__with_defaults_fills_only_what_is_missing():
    defaults = {"queue": "bulk", "priority": 5, "on_restart": "resume"}
    bare = parse.Submission("x").with_defaults(**defaults)
    assert bare == parse.Submission("x", {}, "bulk", 5, "resume")
    given = parse.Submission("x", {"a": 1}, "fast", 0, "fail").with_defaults(**defaults)
    assert given == parse.Submission("x", {"a": 1}, "fast", 0, "fail")  # 0 is a priority


def test_parse_submission__null_fields_are_absent_and_whole_floats_integers():
    data = {"operation": "x", "input": None, "queue": None, "priority": 2.0, "on_restart": None}
    assert parse.parse_submission(data) == parse.Submission("x", {}, None, 2, None)


def test_request_digest__ignores_formatting_and_key_order_not_values():
    a = parse.request_digest("POST", "jobs", json.loads('{"operation": "x", "input": {"a": 1}}'))
    b = parse.request_digest("post", "jobs", json.loads('{"input":{"a":1},"operation":"x"}'))
    c = parse.request_digest("POST", "jobs", {"operation": "x", "input": {"a": 2}})
    d = parse.request_digest("POST", "other", {"operation": "x", "input": {"a": 1}})
    assert a == b
    assert len({a, c, d}) == 3


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ({"a": "ok"}, None),
        ({"a": "b\x00"}, "a"),
        ({"a": {"b": ["x", "\x00"]}}, "a.b[1]"),
        ({"k\x00": 1}, "body"),  # a key at the top level
        ({"a": {"k\x00": 1}}, "a"),
        ({"a": "\ud800"}, "a"),  # an unpaired surrogate has no UTF-8 form
        ({"a": ["ok", "x\udfff"]}, "a[1]"),
        ({"a": "\U0001f600"}, None),  # a real astral character is fine
    ],
)
def test_find_unstorable(value, where):
    assert parse.find_unstorable(value) == where


def test_find_unstorable__survives_deep_nesting():
    deep: list = []
    for _ in range(50_000):
        deep = [deep]
    assert parse.find_unstorable({"a": deep}) is None


def test_parse_submission__fills_optional_fields():
    submission = parse.parse_submission({"operation": "x", "priority": -100, "queue": "q.1"})
    assert submission == parse.Submission("x", {}, "q.1", -100, None)


@pytest.mark.parametrize(
    ("data", "bad"),
    [
        ({}, ["operation"]),  # required
        ({"operation": ""}, ["operation"]),
        ({"operation": "x" * 101}, ["operation"]),
        ({"operation": 5}, ["operation"]),
        ({"operation": "x", "input": [1]}, ["input"]),
        ({"operation": "x", "priority": True}, ["priority"]),  # bool is not an integer here
        ({"operation": "x", "priority": 101}, ["priority"]),
        ({"operation": "x", "priority": 1.5}, ["priority"]),
        ({"operation": "x", "priority": "1"}, ["priority"]),
        ({"operation": "x", "on_restart": "never"}, ["on_restart"]),
        ({"operation": "x", "queue": ""}, ["queue"]),
        ({"operation": "x", "queue": "-leading"}, ["queue"]),
        ({"operation": "x", "queue": "q" * 65}, ["queue"]),
        ({"operation": "x", "priorty": 1}, ["priorty"]),  # a typo is not silently ignored
        ({"priority": 500, "extra": 1}, ["extra", "operation", "priority"]),  # all at once
    ],
)
def test_parse_submission__refuses(data, bad):
    with pytest.raises(Refusal) as info:
        parse.parse_submission(data)
    assert info.value.status == 400
    assert sorted(fields(info)) == bad


# --- query strings --------------------------------------------------------------------


def test_cursor__round_trips():
    for before in (1, 42, parse.MAX_ID):
        assert parse.decode_cursor(parse.encode_cursor(before)) == before


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "!!!",  # not base64
        "djE6",  # "v1:" without an id
        "djE6MA",  # "v1:0"
        "djI6NQ",  # "v2:5": a version we never issued
        "djE6LTE",  # "v1:-1"
        "djE6OTk5OTk5OTk5OTk5OTk5OTk5OTk5",  # beyond BIGINT
        "x" * 41,
    ],
)
def test_cursor__refuses_what_we_never_issued(cursor):
    with pytest.raises(Refusal) as info:
        parse.decode_cursor(cursor)
    assert fields(info) == ["query.cursor"]


def test_parse_list_query__defaults_and_values():
    assert parse.parse_list_query({}) == parse.ListQuery()
    cursor = parse.encode_cursor(10)
    query = parse.parse_list_query(
        {
            "state": ["queued,running", "queued"],
            "operation": ["x"],
            "cursor": [cursor],
            "limit": ["7"],
        }
    )
    assert query == parse.ListQuery(("queued", "running"), "x", 10, 7)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        # the issue's own example: unused filters sent empty, as a form or template does
        ({"state": [""], "operation": [""], "cursor": [""]}, parse.ListQuery()),
        ({"cursor": [""]}, parse.ListQuery()),
        ({"state": ["", "paused"]}, parse.ListQuery(states=("paused",))),
        ({"state": [" "]}, parse.ListQuery()),
        ({"state": ["paused , queued"]}, parse.ListQuery(states=("paused", "queued"))),
    ],
)
def test_parse_list_query__empty_values_are_absent(params, expected):
    assert parse.parse_list_query(params) == expected


@pytest.mark.parametrize(
    ("params", "bad"),
    [
        ({"state": ["done"]}, "query.state"),
        ({"state": ["queued,"]}, "query.state"),  # an empty name inside a list is a typo
        ({"state": ["queued\t"]}, "query.state"),  # spaces only, as the document's pattern
        ({"limit": [""]}, "query.limit"),  # a number must be a number
        ({"limit": ["0"]}, "query.limit"),
        ({"limit": ["201"]}, "query.limit"),
        ({"limit": ["-1"]}, "query.limit"),
        ({"limit": ["1e3"]}, "query.limit"),
        ({"limit": ["٣"]}, "query.limit"),  # an Arabic-Indic digit is a digit to str.isdigit
        ({"limit": ["1", "2"]}, "query.limit"),  # given twice
        ({"operation": ["a\x00b"]}, "query.operation"),  # NUL cannot reach PostgreSQL
        ({"operation": ["x" * 101]}, "query.operation"),
        ({"status": ["queued"]}, "query.status"),  # a typo for state
    ],
)
def test_parse_list_query__refuses(params, bad):
    with pytest.raises(Refusal) as info:
        parse.parse_list_query(params)
    assert fields(info) == [bad]


@pytest.mark.parametrize(
    ("params", "last_event_id", "expected"),
    [
        ({}, None, parse.EventsQuery(0, 100)),
        ({"after": ["5"], "limit": ["2"]}, None, parse.EventsQuery(5, 2)),
        ({"after": ["5"]}, "9", parse.EventsQuery(9, 100)),  # a reconnecting client wins
        ({"after": ["5"]}, " ", parse.EventsQuery(5, 100)),  # empty Last-Event-ID: ignored
        ({}, "0", parse.EventsQuery(0, 100)),
        ({}, "\t7 ", parse.EventsQuery(7, 100)),  # HTTP's optional whitespace is not the value
        ({}, str(parse.MAX_ID), parse.EventsQuery(parse.MAX_ID, 100)),  # 19 digits
    ],
)
def test_parse_events_query(params, last_event_id, expected):
    assert parse.parse_events_query(params, last_event_id) == expected


@pytest.mark.parametrize(
    ("params", "last_event_id", "bad"),
    [
        ({"after": ["-1"]}, None, "query.after"),
        ({"after": ["x"]}, None, "query.after"),
        ({"after": ["99999999999999999999"]}, None, "query.after"),
        ({"limit": ["1001"]}, None, "query.limit"),
        ({}, "abc", "header.Last-Event-ID"),
        ({}, str(parse.MAX_ID + 1), "header.Last-Event-ID"),
        ({}, "1 2", "header.Last-Event-ID"),
        ({"since": ["1"]}, None, "query.since"),
    ],
)
def test_parse_events_query__refuses(params, last_event_id, bad):
    with pytest.raises(Refusal) as info:
        parse.parse_events_query(params, last_event_id)
    assert fields(info) == [bad]


# --- SSE framing and tokens -----------------------------------------------------------


def test_sse_frames():
    assert parse.sse_event('{"a":1}', event_id=3) == 'id: 3\ndata: {"a":1}\n\n'
    assert parse.sse_event("x", event="end") == "event: end\ndata: x\n\n"
    assert parse.sse_event("a\nb") == "data: a\ndata: b\n\n"  # a line break cannot end a frame
    assert parse.sse_comment("keep-alive") == ": keep-alive\n\n"
    assert parse.sse_retry(2000) == "retry: 2000\n\n"


def test_tokens__new_token_matches_only_itself():
    one, two = tokens.new_token(), tokens.new_token()
    assert one.token.startswith("dur_")
    assert tokens.token_prefix(one.token) == one.prefix
    assert one.token != two.token
    assert tokens.token_matches(one.token, one.hash)
    assert not tokens.token_matches(two.token, one.hash)
    assert not tokens.token_matches(one.token, None)  # unknown prefix: still compared, refused
    assert one.hash == tokens.hash_token(one.token)
    assert one.token not in one.hash


@pytest.mark.parametrize(
    "token",
    ["", "dur_", "dur_0123456789ab_short", "xyz_0123456789ab_" + "a" * 43, "dur_XYZ_" + "a" * 43],
)
def test_tokens__malformed_has_no_prefix(token):
    assert tokens.token_prefix(token) is None


# --- who may act on a job -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("owner", "scopes", "allowed"),
    [
        ("api:ci", ["jobs:write"], True),  # its own job
        ("api:other", ["jobs:write"], False),  # another client's
        ("", ["jobs:write"], False),  # started on the dashboard or by a command
        ("schedule:nightly", ["jobs:write"], False),  # started by a schedule
        ("api:ci-2", ["jobs:write"], False),  # a name that merely starts with ours
        ("api:other", ["jobs:write", "jobs:admin"], True),  # admin: every job
        ("", ["jobs:admin"], True),
    ],
)
def test_may_act_on(owner, scopes, allowed):
    assert auth.may_act_on(owner, Client(name="ci", scopes=scopes)) is allowed


# --- schedules ----------------------------------------------------------------------------


def test_parse_schedule__defaults_and_values():
    assert parse.parse_schedule(
        {"name": " nightly ", "operation": "x", "cron": "@daily"}
    ) == parse.ScheduleSpec("nightly", "x", cron="@daily")
    spec = parse.parse_schedule(
        {"name": "n", "operation": "x", "interval": "90s", "input": {"a": 1}, "time_zone": None,
         "catch_up": "skip", "overlap": True, "queue": "bulk", "priority": 3.0, "enabled": False}
    )  # fmt: skip
    assert spec == parse.ScheduleSpec(
        "n", "x", every=timedelta(seconds=90), input={"a": 1}, catch_up="skip", overlap=True,
        queue="bulk", priority=3, enabled=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("data", "bad"),
    [
        ({"operation": "x", "cron": "@daily"}, ["name"]),
        ({"name": "a\nb", "operation": "x", "cron": "@daily"}, ["name"]),
        ({"name": "n", "cron": "@daily"}, ["operation"]),
        ({"name": "n", "operation": "x"}, ["cron"]),  # neither
        ({"name": "n", "operation": "x", "cron": "@daily", "interval": "1h"}, ["cron"]),  # both
        ({"name": "n", "operation": "x", "cron": 5}, ["cron"]),  # a type error is not "both"
        ({"name": "n", "operation": "x", "cron": "@often"}, ["cron"]),
        ({"name": "n", "operation": "x", "interval": "-1m"}, ["interval"]),
        ({"name": "n", "operation": "x", "interval": 60}, ["interval"]),  # seconds as a string
        ({"name": "n", "operation": "x", "cron": "@daily", "time_zone": "Nowhere"}, ["time_zone"]),
        ({"name": "n", "operation": "x", "cron": "@daily", "overlap": 1}, ["overlap"]),
        ({"name": "n", "operation": "x", "cron": "@daily", "enabled": "true"}, ["enabled"]),
        ({"name": "n", "operation": "x", "cron": "@daily", "input": "{}"}, ["input"]),
        ({"name": "n", "operation": "x", "cron": "@daily", "priority": True}, ["priority"]),
        ({"name": "n", "operation": "x", "cron": "@daily", "unique_key": "k"}, ["unique_key"]),
    ],
)
def test_parse_schedule__refuses(data, bad):
    with pytest.raises(Refusal) as info:
        parse.parse_schedule(data)
    assert fields(info) == bad


@pytest.mark.parametrize(
    ("data", "result"),
    [({"enabled": True}, True), ({"enabled": False}, False)],
)
def test_parse_schedule_patch(data, result):
    assert parse.parse_schedule_patch(data) is result


@pytest.mark.parametrize(
    ("data", "bad"),
    [({}, ["enabled"]), ({"enabled": 0}, ["enabled"]), ({"enabled": True, "name": "x"}, ["name"])],
)
def test_parse_schedule_patch__refuses(data, bad):
    with pytest.raises(Refusal) as info:
        parse.parse_schedule_patch(data)
    assert fields(info) == bad


def test_parse_schedule_list_query():
    assert parse.parse_schedule_list_query({}) == parse.ScheduleListQuery()
    assert parse.parse_schedule_list_query(
        {"operation": [""], "cursor": [""], "limit": ["3"]}
    ) == parse.ScheduleListQuery(limit=3)
    with pytest.raises(Refusal):
        parse.parse_schedule_list_query({"state": ["queued"]})
