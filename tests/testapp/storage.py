"""A storage that mis-stores data, for the file-move verification tests."""

from __future__ import annotations

from typing import Any

from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage


class CorruptingStorage(FileSystemStorage):
    """Stores every file with its last byte flipped: a destination whose copies do not verify."""

    def _save(self, name: str, content: Any) -> str:
        data = b"".join(content.chunks())
        if data:
            data = data[:-1] + bytes([data[-1] ^ 0xFF])
        return super()._save(name, ContentFile(data))
