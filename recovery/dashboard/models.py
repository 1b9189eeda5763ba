"""Per-day counts of Recovery events, kept by database triggers (see ``recovery.dashboard.sql``).

The Summary chart needs events per day and the Recovery page needs its totals
(All / Done / Failed / Deleted). Counting a million rows on every page view is
too slow, so every insert, update or delete of a ``RecoveryEvent`` adjusts one
row here in the same transaction — by trigger, so the ingest's raw bulk
inserts are counted as well as the ORM's. The day is the event's own time
(``ts``, else ``recorded_at``) in UTC.
"""

from __future__ import annotations

from django.db import models


class DailyCount(models.Model):
    day = models.DateField()
    failed = models.BooleanField(help_text="done is false")
    deleted = models.BooleanField(help_text="deleted_data")
    events = models.BigIntegerField(default=0)

    class Meta:
        db_table = "recovery_dailycount"
        constraints = [
            models.UniqueConstraint(
                fields=["day", "failed", "deleted"], name="recovery_dailycount_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.day} failed={self.failed} deleted={self.deleted}: {self.events}"
