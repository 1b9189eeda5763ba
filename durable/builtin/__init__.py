"""Operations that ship with the engine; importing this package registers them."""

from . import noop, retention

__all__ = ["noop", "retention"]
