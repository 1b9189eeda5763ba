"""Every setting ``recovery`` reads, with its default, applied once when the app loads.

The same mechanism as ``durable.conf`` (whose settings the dashboard also reads):
``RecoveryConfig`` sets each default the site's settings do not define, before any
module of the app is imported. docs/reference/settings.md lists them.
"""

from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, Any] = {
    # The recovery-events.jsonl file; "": the WeKan data directory variables, else none.
    "RECOVERY_EVENTS_FILE": "",
    "RECOVERY_INGEST_INTERVAL": 60.0,  # seconds; 0: only when a worker starts
    "RECOVERY_IMPORT_DIRS": [],  # []: BASE_DIR/var/imports, created when first needed
    "CONTENT_SECURITY_POLICY": None,  # None: recovery.dashboard.csp.DEFAULT_POLICY
    # Where the dashboard sends a visitor who is not logged in: its own login page.
    "RECOVERY_LOGIN_URL": "problems:login",
}
