"""durable.logs: every record is one logfmt line, a traceback in one escaped field."""

from __future__ import annotations

import json
import logging
import shlex

import pytest

from durable.logs import MAX_TRACEBACK_CHARS, LogfmtFormatter


def _record(msg: str, *, exc: BaseException | None = None, **extra: object) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    record = logging.LogRecord("durable.worker", logging.ERROR, __file__, 1, msg, None, exc_info)
    record.__dict__.update(extra)
    return record


def _raised() -> BaseException:
    def deeper() -> None:
        raise RuntimeError("the claim failed:\nsecond line")

    try:
        deeper()
    except RuntimeError as exc:
        return exc
    raise AssertionError("not raised")


def _fields(line: str) -> dict[str, str]:
    """logfmt back into fields (its quoting is JSON's, which shlex reads for these lines)."""
    return dict(part.split("=", 1) for part in shlex.split(line))


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        # a plain record
        (_record("worker started", worker="h:1:ab"), {"msg": "worker started", "worker": "h:1:ab"}),
        # a message with a line break stays on its line, escaped
        (_record("two\nlines"), {"msg": "two\\nlines"}),
        # a field with a line break too
        (_record("x", detail="a\r\nb"), {"detail": "a\\r\\nb"}),
    ],
)
def test_format__one_line_whatever_the_text(record, expected):
    line = LogfmtFormatter().format(record)
    assert "\n" not in line
    assert "\r" not in line
    fields = _fields(line)
    for key, value in expected.items():
        assert fields[key] == value


def test_format__a_traceback_goes_in_one_escaped_field():
    line = LogfmtFormatter().format(_record("claim failed; retrying", exc=_raised(), worker="w"))
    assert "\n" not in line
    assert line.count(" traceback=") == 1
    fields = _fields(line)
    assert fields["error_class"] == "RuntimeError"
    assert fields["worker"] == "w"
    raw = line.split(" traceback=", 1)[1]
    text = json.loads(raw)  # the field is one JSON string: a shipper can unescape it
    assert text.startswith("Traceback (most recent call last):\n")
    assert text.endswith("RuntimeError: the claim failed:\nsecond line")


def test_format__a_long_traceback_keeps_its_end():
    try:
        raise ValueError("x" * 3 * MAX_TRACEBACK_CHARS + " the end")
    except ValueError as exc:
        line = LogfmtFormatter().format(_record("long", exc=exc))
    text = json.loads(line.split(" traceback=", 1)[1])
    assert len(text) == MAX_TRACEBACK_CHARS + 1
    assert text.startswith("…x")
    assert text.endswith("x the end")


def test_format__stack_info_in_one_field_too():
    record = _record("where am I")
    record.stack_info = "Stack (most recent call last):\n  File x, line 1"
    line = LogfmtFormatter().format(record)
    assert "\n" not in line
    assert json.loads(line.split(" stack=", 1)[1]).endswith("File x, line 1")
