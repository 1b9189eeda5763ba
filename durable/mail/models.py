"""The models of mail recipients and mail deliveries live in ``durable.models.mail``.

This module keeps the older import path working for code outside the engine;
the engine's own modules import ``durable.models``."""

from ..models.mail import (
    AT_LEAST_ONCE,
    MailDelivery,
    MailRecipient,
    MailState,
)

__all__ = [
    "AT_LEAST_ONCE",
    "MailDelivery",
    "MailRecipient",
    "MailState",
]
