"""The worker: claims due jobs, runs their units in order, renews leases.

``python manage.py runworker`` builds a ``Worker`` and calls ``run()``. Each of
``concurrency`` threads claims one job at a time. One more thread renews every
lease this process holds and beats the worker's heartbeat, and does nothing
else, so nothing can stall it: it never waits for a row lock (an atomic unit
of ours may hold one) and never runs signal receivers. A third thread does the
housekeeping that may be slow — reclaiming jobs of stopped workers, the
``worker_heartbeat`` signal's chores. On SQLite a fourth only touches the
worker's pulse file (``rescue.pulse``), which no database lock can delay.
Scale out with more processes (on one or many machines sharing PostgreSQL),
not more threads: units are mostly I/O, and processes isolate crashes.

The parts, each in its own module (a module imports only those listed after it):

- ``lifecycle``: ``Worker`` — start, the wait for a stop, signals, sign-off;
- ``executors``: the executor threads' loop (claim, run, claim again);
- ``runner``: one claimed job, unit by unit, each committed;
- ``failures``: what a failed or stopped unit leaves its job in;
- ``lookahead``: whether the last unit's commit can complete the job too;
- ``renewal``: the renewal thread, which runs the ``watchdog`` each round;
- ``watchdog``: units that overrun their ``unit_timeout``, and exit 70;
- ``housekeeping``: the heartbeat signal's chores and reclaims;
- ``pulse``: SQLite's pulse file;
- ``desk``: the claim desk, one claim statement for the threads waiting together;
- ``execution``: a running job as the threads share it;
- ``identity``: the worker's id.
"""

from .desk import ClaimDesk, ClaimFailed
from .execution import Execution, Executions
from .identity import MAX_WORKER_ID_PREFIX, default_worker_id
from .lifecycle import Worker
from .watchdog import EXIT_UNIT_TIMEOUT

__all__ = [
    "EXIT_UNIT_TIMEOUT",
    "MAX_WORKER_ID_PREFIX",
    "ClaimDesk",
    "ClaimFailed",
    "Execution",
    "Executions",
    "Worker",
    "default_worker_id",
]
