"""The HTTP API served by a real gunicorn whose connections go through PgBouncer (transaction mode).

The core of the live-server tests, run again with the server and the workers
connecting through a real PgBouncer (``tests.pgbouncer``): a 202 means committed
and an idempotent replay survives a restart, an event stream follows a worker,
hostile requests get precise refusals, extra streams a 503.
"""

from __future__ import annotations

import pytest

from tests.integration.api.test_api_server import (  # noqa: F401 - collected again, pooled
    test_events_stream__resumes_from_last_event_id_while_a_worker_produces_events,
    test_hostile_requests__get_precise_refusals_never_a_500,
    test_streams__pages_are_served_while_streams_are_open_and_extra_streams_get_503,
    test_submit__committed_before_202_and_replayed_after_a_restart,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    # Before the live server starts: it reads the URL to connect to when it starts.
    pytest.mark.usefixtures("through_pgbouncer"),
]
