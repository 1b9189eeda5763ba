"""One structured line per state change, in logfmt (``key=value``), for grep and log shippers."""

from __future__ import annotations

import json
import logging
from typing import Any

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}
MAX_FIELD_CHARS = 300


def _quote(value: Any) -> str:
    if not isinstance(value, str):
        value = json.dumps(value, default=str, separators=(",", ":"))
    if len(value) > MAX_FIELD_CHARS:
        value = value[:MAX_FIELD_CHARS] + "…"
    if value == "" or any(c in value for c in ' ="\n\t'):
        return json.dumps(value, ensure_ascii=False)
    return value


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
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line
