"""One structured line per state change, in logfmt (``key=value``), for grep and log shippers.

Every record is one line, a traceback included: it goes in one escaped field
(``traceback="Traceback (most recent call last):\\n  File …"``), so a log
shipper never splits a record and ``grep job=42`` finds the whole of it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}
MAX_FIELD_CHARS = 300
# A traceback keeps its end when cut: the exception and the frames nearest to it.
MAX_TRACEBACK_CHARS = 8000


def _quote(value: Any) -> str:
    if not isinstance(value, str):
        value = json.dumps(value, default=str, separators=(",", ":"))
    if len(value) > MAX_FIELD_CHARS:
        value = value[:MAX_FIELD_CHARS] + "…"
    if value == "" or any(c in value for c in ' ="\n\t\r'):
        return json.dumps(value, ensure_ascii=False)
    return value


def _escaped_tail(text: str) -> str:
    text = text.rstrip("\n")
    if len(text) > MAX_TRACEBACK_CHARS:
        text = "…" + text[-MAX_TRACEBACK_CHARS:]
    return json.dumps(text, ensure_ascii=False)


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        parts = [
            f"time={self.formatTime(record, '%Y-%m-%dT%H:%M:%S')}",
            f"level={record.levelname.lower()}",
            f"logger={record.name}",
            f"msg={_quote(record.getMessage())}",
        ]
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                parts.append(f"{key}={_quote(value)}")
        if record.exc_info and record.exc_info[1] is not None:
            parts.append(f"error_class={_quote(type(record.exc_info[1]).__name__)}")
        if record.exc_info:
            parts.append(f"traceback={_escaped_tail(self.formatException(record.exc_info))}")
        if record.stack_info:
            parts.append(f"stack={_escaped_tail(self.formatStack(record.stack_info))}")
        return " ".join(parts)
