"""Writing Recovery and Security rows: the one place that does.

``record_event`` (``events``) and ``record_security`` (``security``) are
best-effort by design: an audit write must never throw into (or undo) the action
it reports, so both log and swallow every error — database errors included — and
return None. They are the package's public names, imported from here.
``lines.insert_lines`` is the ingest's bulk path; ``cursors`` keeps the ingest's
place in each file.
"""

from .events import record_event
from .security import record_security

__all__ = ["record_event", "record_security"]
