"""The ingest's place in each file: one cursor per file (device:inode), one record
per name the file was read under.

A cursor moves only from where its mover found it (``advance_cursor`` is
conditional), so two ingests of one file cannot both import the same lines.
"""

from __future__ import annotations

from typing import Any

from django.db.models import F
from django.utils import timezone

from ..models import IngestCursor, IngestPath
from ..policy import Position


def name_for(path: str) -> IngestPath:
    """The record of one name of the file (``path`` already canonical: ``tailer.canonical``)."""
    name, _ = IngestPath.objects.get_or_create(path=path)
    return name


def cursor_of_file(file_id: str) -> IngestCursor | None:
    """The cursor following the file with this device:inode, under whatever name."""
    return IngestCursor.objects.filter(file_id=file_id).first() if file_id else None


def follow(path: str, start: Position) -> IngestCursor:
    """The cursor of ``start.file_id``, created at ``start`` if the file is new to the ingest.

    Two ingests meeting a new file at once agree on one row (the unique
    device:inode); the loser gets the winner's, position and all.
    """
    cursor, _ = IngestCursor.objects.get_or_create(
        file_id=start.file_id, defaults={"path": path, **_position_fields(start)}
    )
    return cursor


def is_followed(file_id: str) -> bool:
    return IngestCursor.objects.filter(file_id=file_id).exists()


def position_of(cursor: IngestCursor) -> Position:
    return Position(
        file_id=cursor.file_id,
        generation=cursor.generation,
        offset=cursor.offset,
        head=cursor.head,
        tail=cursor.tail,
        crc=cursor.crc,
        skipping=cursor.skipping,
        tag=cursor.tag,
    )


def _position_fields(position: Position) -> dict[str, Any]:
    return {
        "file_id": position.file_id,
        "tag": position.tag,
        "generation": position.generation,
        "offset": position.offset,
        "head": position.head,
        "tail": position.tail,
        "crc": position.crc,
        "skipping": position.skipping,
    }


def advance_cursor(
    cursor_id: int,
    expected: Position,
    new: Position,
    *,
    imported: int = 0,
    skipped: int = 0,
    path: str | None = None,
) -> bool:
    """Move the cursor from ``expected`` to ``new``; False if another ingest moved it first."""
    fields: dict[str, Any] = {**_position_fields(new), "updated_at": timezone.now()}
    if imported:
        fields["lines_imported"] = F("lines_imported") + imported
    if skipped:
        fields["lines_skipped"] = F("lines_skipped") + skipped
    if path is not None:
        fields["path"] = path
    updated = IngestCursor.objects.filter(
        pk=cursor_id,
        file_id=expected.file_id,
        tag=expected.tag,
        generation=expected.generation,
        offset=expected.offset,
        skipping=expected.skipping,
    ).update(**fields)
    return updated == 1


def point_name(name_id: int, cursor_id: int | None, *, seen: str) -> None:
    """The name now holds the file ``cursor_id`` follows, looked at as ``seen``."""
    IngestPath.objects.filter(pk=name_id).update(
        cursor_id=cursor_id, seen=seen, updated_at=timezone.now()
    )
