"""``python manage.py disable_schedule NAME``."""

from __future__ import annotations

from .enable_schedule import Command as EnableCommand


class Command(EnableCommand):
    help = (
        "Disable a schedule: no occurrence is applied until it is enabled again. Jobs "
        "already enqueued are not touched (pause or cancel them as jobs)."
    )
    enabled = False
