"""Operations that ship with the engine; importing this package registers them."""

from . import files, noop, retention

__all__ = ["files", "noop", "retention"]
