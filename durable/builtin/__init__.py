"""Operations that ship with the engine; importing this package registers them."""

from . import backup, dbcopy, files, integrity, noop, restore, retention

__all__ = ["backup", "dbcopy", "files", "integrity", "noop", "restore", "retention"]
