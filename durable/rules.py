"""The rules a job's fields obey, stated once for every way in.

The model's columns and constraints, ``enqueue()``, schedules, the HTTP API's
parsing and its OpenAPI document, the Django Tasks backend, ``runworker``'s
options and pausing a queue all read these, so a name or a priority that one
of them accepts is accepted by all of them. Pure: no Django, no database.
"""

from __future__ import annotations

import re
from typing import Any

PRIORITY_MIN = -100
PRIORITY_MAX = 100
PRIORITY_RULE = f"an integer from {PRIORITY_MIN} to {PRIORITY_MAX}; higher runs first"

QUEUE_NAME_MAX = 64  # the width of Job.queue
# ASCII letters and digits first, then letters, digits, _ . : - (``emails``, ``eu-west:low``).
QUEUE_NAME_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9_.:-]{{0,{QUEUE_NAME_MAX - 1}}}$"
QUEUE_NAME_RULE = (
    f"1 to {QUEUE_NAME_MAX} letters, digits, _ . : - (starting with a letter or digit)"
)
_QUEUE_NAME = re.compile(QUEUE_NAME_PATTERN)

UNIQUE_KEY_MAX = 255  # the width of Job.unique_key


def priority_problem(value: Any) -> str | None:
    """Why ``value`` is not a priority, or None when it is one.

    JSON has one number type, so an integral float (``5.0``) counts as the
    integer it equals; a bool, which Python counts as an int, does not.
    """
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be {PRIORITY_RULE}"
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        return f"must be {PRIORITY_RULE}"
    return None


def priority_from(value: Any) -> int:
    """The priority ``value`` stands for when code passes it (``enqueue()``, schedules).

    Read with ``int()``, as ``enqueue()`` always has (``"5"`` and ``5.0`` are 5),
    then held to the range; ValueError with the rule when it is not a priority.
    The HTTP API is stricter about JSON types: it asks ``priority_problem``.
    """
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"must be {PRIORITY_RULE}") from None
    problem = priority_problem(number)
    if problem is not None:
        raise ValueError(problem)
    return number


def is_queue_name(value: Any) -> bool:
    """Whether ``value`` is a queue name every part of the engine accepts."""
    return isinstance(value, str) and _QUEUE_NAME.match(value) is not None


def queue_name_problem(value: Any) -> str | None:
    """Why ``value`` is not a queue name, or None when it is one."""
    return None if is_queue_name(value) else f"must be {QUEUE_NAME_RULE}"
