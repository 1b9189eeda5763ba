"""Named fault points, switched on by environment variable, for crash tests.

``DURABLE_FAULTS="after_unit:3,before_complete"`` makes the worker SIGKILL
itself the 3rd time it reaches ``after_unit`` and the first time it reaches
``before_complete``. ``name:N:stop`` sends SIGSTOP instead (a stalled worker,
for fencing tests). Points, in unit order:

- ``after_claim``       — the job is claimed, no unit ran yet
- ``before_unit``       — step 2 done, the unit is about to run
- ``after_unit``        — step 3 done (side effects happened), checkpoint not yet advanced
- ``after_checkpoint``  — step 4 committed
- ``before_complete``   — every unit done, completion not yet committed (the
  separate completion; a last unit whose commit completes the job has the next two)
- ``finish_before_commit`` — the last unit ran and its commit also completes the
  job: on SQLite inside that transaction, its writes made, COMMIT not yet sent; on
  PostgreSQL just before its single statement (which is its own transaction)
- ``finish_after_commit`` — that merged commit returned: the job is completed

Operations may add their own points with ``durable.faults.reach("name")``.
With the variable unset this module costs one dictionary lookup per point.

``DURABLE_FAULTS_TRACE=/path`` appends the name of every point reached, one
per line, to that file (opened and closed per point, so a SIGKILL loses
nothing): the crash tests learn from a crash-free run which points an
operation passes, then kill a worker at each of them.
"""

from __future__ import annotations

import os
import signal
import threading

_lock = threading.Lock()
_counts: dict[str, int] = {}


def _parse(spec: str) -> dict[str, tuple[int, str]]:
    plan: dict[str, tuple[int, str]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, rest = item.partition(":")
        nth, _, action = rest.partition(":")
        plan[name] = (int(nth or 1), action or "kill")
    return plan


_plan = _parse(os.environ.get("DURABLE_FAULTS", ""))
_trace = os.environ.get("DURABLE_FAULTS_TRACE", "")


def reach(name: str) -> None:
    if _trace:
        with _lock, open(_trace, "a") as handle:
            handle.write(name + "\n")
    if not _plan or name not in _plan:
        return
    nth, action = _plan[name]
    with _lock:
        _counts[name] = _counts.get(name, 0) + 1
        hit = _counts[name] == nth
    if hit:
        # Directed at this thread: a process-directed SIGSTOP may be taken by
        # another thread while this one runs on (and commits) for a moment.
        signal.pthread_kill(
            threading.get_ident(), signal.SIGSTOP if action == "stop" else signal.SIGKILL
        )
