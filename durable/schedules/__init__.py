"""Scheduled rules: cron or interval schedules that enqueue durable jobs.

- ``models``: ``Schedule`` and ``Occurrence``;
- ``timing``: when occurrences fall, and the catch-up decision (pure);
- ``service``: add, change, enable, disable, remove, and ``tick()``;
- ``ticking``: every worker calls ``tick()`` when it starts and on each heartbeat.
"""
