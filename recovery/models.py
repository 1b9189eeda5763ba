"""Recovery and Security reports, and the ingest's cursor into the JSONL file.

What each report holds and why: docs/explanation/recovery-and-security-events.md.

``RecoveryEvent`` is an append-only history: what the launch scripts did to
the data (from ``recovery-events.jsonl``), what restart recovery did to jobs,
what administrators recorded. ``SecurityEvent`` is one summary row per *kind*
of security refusal, so an attack grows a counter, not the table.

Rows are written through ``recovery.records`` (``record_event``,
``record_security``) and the ingest operation; read them through the query
methods below, which the indexes are built for.
"""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.db.models import Q
from django.utils import timezone

from .parsing import MAX_SOURCE_CHARS, MAX_TYPE_CHARS


class Severity(models.TextChoices):
    INFO = "info", "Info"
    WARNING = "warning", "Warning"
    ERROR = "error", "Error"


class EventType:
    """Known ``RecoveryEvent.type`` values; any other non-empty string is allowed too."""

    CORRUPTION_DETECTED = "corruption-detected"
    BACKUP_CREATED = "backup-created"
    BACKUP_VERIFIED = "backup-verified"
    RESTORE_BACKUP = "restore-backup"
    RESTORE_PREV = "restore-prev"
    REMIGRATE = "remigrate"
    BLOAT_REPAIRED = "bloat-repaired"
    INTEGRITY_OK = "integrity-ok"
    MANUAL_REQUIRED = "manual-required"
    PERMANENT_DELETE_SETTING_CHANGED = "permanent-delete-setting-changed"
    BOARD_PERMANENTLY_DELETED = "board-permanently-deleted"
    JOB_RECLAIMED = "job-reclaimed-after-restart"
    # Reported by this project (not by WeKan's scripts):
    JOB_FAILED = "job-failed"  # failed after its attempts, non-retryable, or by on_restart=fail
    JOB_PAUSED = "job-paused"  # paused: attempts exhausted, or a credential/storage missing
    INGEST_REPORT = "recovery-events-ingest"  # an ingest skipped lines or met a changed file

    ALL = (
        CORRUPTION_DETECTED,
        BACKUP_CREATED,
        BACKUP_VERIFIED,
        RESTORE_BACKUP,
        RESTORE_PREV,
        REMIGRATE,
        BLOAT_REPAIRED,
        INTEGRITY_OK,
        MANUAL_REQUIRED,
        PERMANENT_DELETE_SETTING_CHANGED,
        BOARD_PERMANENTLY_DELETED,
        JOB_RECLAIMED,
        JOB_FAILED,
        JOB_PAUSED,
        INGEST_REPORT,
    )


class RecoveryEventQuerySet(models.QuerySet):
    """Every method keeps the newest-first order servable by an index (see Meta.indexes).

    Newest first is ``id`` descending: ids are handed out as events are
    recorded, so the order is ``recorded_at``'s without its ties, and the
    primary key serves it — no extra index to write per imported line.
    """

    def newest_first(self) -> RecoveryEventQuerySet:
        return self.order_by("-id")

    def before(self, pk: int) -> RecoveryEventQuerySet:
        """Keyset paging: rows older than the row ``pk``, for ``newest_first()``."""
        return self.filter(id__lt=pk)

    def done(self) -> RecoveryEventQuerySet:
        """Done, including legacy events that never said (``done`` missing means done)."""
        return self.exclude(done=False)

    def failed(self) -> RecoveryEventQuerySet:
        return self.filter(done=False)

    def deleted(self) -> RecoveryEventQuerySet:
        return self.filter(deleted_data=True)

    def problems(self) -> RecoveryEventQuerySet:
        """What an operator should look at: failed, or reported as a warning or error."""
        return self.filter(Q(done=False) | Q(severity__in=[Severity.WARNING, Severity.ERROR]))

    def for_job(self, job_id: int) -> RecoveryEventQuerySet:
        return self.filter(job_id=job_id)


class RecoveryEvent(models.Model):
    type = models.CharField(max_length=MAX_TYPE_CHARS, help_text="See EventType; any string.")
    severity = models.CharField(max_length=7, choices=Severity.choices, default=Severity.INFO)
    source = models.CharField(
        max_length=MAX_SOURCE_CHARS,
        default="server",
        help_text="startup, server, ferretdb, manual, admin-panel, worker…",
    )
    db = models.CharField(max_length=100, blank=True, default="")
    detail = models.TextField(blank=True, default="")
    done = models.BooleanField(null=True, blank=True, help_text="Empty means done (legacy).")
    deleted_data = models.BooleanField(default=False)
    user_id = models.CharField(max_length=64, blank=True, default="")
    username = models.CharField(max_length=150, blank=True, default="")
    ipv4 = models.GenericIPAddressField(protocol="IPv4", null=True, blank=True)
    ipv6 = models.GenericIPAddressField(protocol="IPv6", null=True, blank=True)
    # Empty is NULL, not []: SQLite checks JSON_VALID on every non-NULL value,
    # which a million-line import pays for per row.
    object_ids = models.JSONField(null=True, blank=True, help_text="At most 200; empty: none.")
    object_titles = models.JSONField(null=True, blank=True, help_text="Parallel to the ids.")
    object_count = models.PositiveIntegerField(default=0, help_text="Objects before bounding.")
    ts = models.DateTimeField(null=True, blank=True, help_text="The event's own time, if given.")
    recorded_at = models.DateTimeField(default=timezone.now)

    # Job events. A plain integer, not a foreign key: retention deletes finished
    # jobs and must never take their recovery history with them.
    job_id = models.BigIntegerField(null=True, blank=True)
    operation = models.CharField(max_length=100, blank=True, default="")
    checkpoint = models.JSONField(null=True, blank=True)
    attempt = models.PositiveIntegerField(null=True, blank=True)
    next_retry_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True, default="", help_text="Bounded failure reason.")
    reclaimed = models.BooleanField(default=False, help_text="Taken back by restart recovery.")

    # Lines of recovery-events.jsonl: "<file tag>:<generation>:<byte offset>:<crc>"
    # (the file by device:inode, not by name: see IngestCursor),
    # unique, so replaying a batch never imports a line twice.
    source_line = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001

    objects = RecoveryEventQuerySet.as_manager()

    class Meta:
        indexes = [
            # Newest first (and the Done filter, most rows) is the primary key
            # read backwards. Failed and Deleted are rare: small partial indexes.
            models.Index(fields=["-id"], name="recovery_event_failed", condition=Q(done=False)),
            models.Index(
                fields=["-id"], name="recovery_event_deleted", condition=Q(deleted_data=True)
            ),
            # Warnings and errors, newest first: with the Failed index, the
            # Summary page's "recent problems" (recovery.dashboard.listing).
            models.Index(
                fields=["-id"],
                name="recovery_event_severe",
                condition=Q(severity__in=["warning", "error"]),
            ),
            models.Index(
                fields=["job_id", "-id"],
                name="recovery_event_job",
                condition=Q(job_id__isnull=False),
            ),
            # Search by who: user name, user id, address (recovery.dashboard.listing). Few
            # events carry them, so partial indexes cost the rest of a million nothing.
            models.Index(
                fields=["username", "-id"],
                name="recovery_event_username",
                condition=Q(username__gt=""),
            ),
            models.Index(
                fields=["user_id", "-id"],
                name="recovery_event_user_id",
                condition=Q(user_id__gt=""),
            ),
            models.Index(
                fields=["ipv4", "-id"], name="recovery_event_ipv4", condition=Q(ipv4__isnull=False)
            ),
            models.Index(
                fields=["ipv6", "-id"], name="recovery_event_ipv6", condition=Q(ipv6__isnull=False)
            ),
        ]
        constraints = [
            models.UniqueConstraint(fields=["source_line"], name="recovery_event_line_unique"),
            models.CheckConstraint(
                condition=Q(severity__in=Severity.values), name="recovery_event_severity_valid"
            ),
            # The bulk insert bypasses Django's validation; the parser never
            # gives an empty type, and the table says so too.
            models.CheckConstraint(condition=~Q(type=""), name="recovery_event_type_not_empty"),
        ]

    def __str__(self) -> str:
        return f"{self.type} #{self.pk}"

    @property
    def is_done(self) -> bool:
        return self.done is not False

    @property
    def affected(self) -> list[tuple[str, str]]:
        """(id, title) of each affected object kept (``object_count`` says how many in all)."""
        return list(zip(self.object_ids or [], self.object_titles or [], strict=False))

    @property
    def when(self) -> datetime:
        """The event's own time when it gave one, else when it was recorded."""
        return self.ts or self.recorded_at


class SecurityEventQuerySet(models.QuerySet):
    def latest_first(self) -> SecurityEventQuerySet:
        return self.order_by("-last_seen", "-id")

    def top(self) -> SecurityEventQuerySet:
        return self.order_by("-count", "-last_seen")


class SecurityEvent(models.Model):
    """One row per kind of problem: (stream, category, key, source, severity, CWE).

    The actor is deliberately not part of the identity: who and from where go
    to the capped tallies, so a flood of refusals from changing addresses
    updates one row.
    """

    stream = models.CharField(max_length=40, default="security")
    category = models.CharField(max_length=64)
    key = models.CharField(max_length=128)
    source = models.CharField(max_length=64, blank=True, default="")
    severity = models.CharField(max_length=7, choices=Severity.choices, default=Severity.WARNING)
    cwe = models.CharField(max_length=16, blank=True, default="")
    detail = models.TextField(blank=True, default="", help_text="The latest detail, bounded.")
    count = models.PositiveBigIntegerField(default=0)
    first_seen = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now)
    users = models.JSONField(default=dict, blank=True, help_text="username → count, ≤ 50.")
    users_overflow = models.PositiveBigIntegerField(default=0)
    addresses = models.JSONField(default=dict, blank=True, help_text="address → count, ≤ 50.")
    addresses_overflow = models.PositiveBigIntegerField(default=0)
    last_ipv4 = models.GenericIPAddressField(protocol="IPv4", null=True, blank=True)
    last_ipv6 = models.GenericIPAddressField(protocol="IPv6", null=True, blank=True)

    objects = SecurityEventQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["stream", "category", "key", "source", "severity", "cwe"],
                name="recovery_security_kind_unique",
            ),
        ]
        indexes = [
            models.Index(fields=["-last_seen", "-id"], name="recovery_security_latest"),
            models.Index(fields=["-count", "-last_seen"], name="recovery_security_top"),
        ]

    def __str__(self) -> str:
        return f"{self.category}/{self.key} x{self.count}"


class IngestCursor(models.Model):
    """How far one file has been imported (see ``policy.Position``), whatever it is called.

    One row per file followed — by device:inode, never by name — so a hard
    link, a bind mount or a symlinked directory naming the same file share
    one position and one line identity (``tag``/``generation``): each line
    is imported once whichever name it was read under. ``IngestPath`` says
    which file each name held at the last look. Advanced in the same
    transaction as the lines it covers, conditional on its previous value,
    so two ingests of one file can never both import a batch.
    """

    path = models.CharField(max_length=1024, help_text="The name it was last read under.")
    tag = models.CharField(max_length=16, help_text="The file's name in line identities.")
    file_id = models.CharField(max_length=64, blank=True, default="", help_text="device:inode")
    generation = models.PositiveIntegerField(default=0)
    offset = models.PositiveBigIntegerField(default=0)
    head = models.CharField(max_length=64, blank=True, default="")
    tail = models.CharField(max_length=64, blank=True, default="")
    crc = models.BigIntegerField(default=0)
    skipping = models.BooleanField(default=False)
    lines_imported = models.PositiveBigIntegerField(default=0)
    lines_skipped = models.PositiveBigIntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["file_id"], condition=~Q(file_id=""), name="recovery_ingest_file_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.path} @ {self.offset}"


class IngestPath(models.Model):
    """A name of ``recovery-events.jsonl`` (symlinks resolved) and the file it held last.

    When the name holds another file than ``cursor``'s, the old one was rotated
    or replaced: the ingest finishes it first (``tailer.find_rotated``).
    ``seen`` is what the worker heartbeat compares to decide whether to look again.
    """

    path = models.CharField(max_length=1024, unique=True)
    cursor = models.ForeignKey(
        IngestCursor, null=True, blank=True, on_delete=models.SET_NULL, related_name="names"
    )
    seen = models.CharField(max_length=128, blank=True, default="", help_text="Last looked at.")
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.path


from .dashboard.models import (  # noqa: E402,F401 - registers the models
    DailyCount,
    SearchCursor,
    ThroughputCount,
    ThroughputHour,
)
from .imports.models import ImportRecord  # noqa: E402,F401 - registers the model
