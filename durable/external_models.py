"""Models of outbound HTTP, webhooks, mail and the credential table, registered with ``durable``."""

from .credential_store import Credential
from .http.models import GateSlot, ProviderGate
from .mail.models import MailDelivery, MailRecipient
from .webhooks.models import Delivery, Endpoint, OutboundEvent

__all__ = [
    "Credential",
    "Delivery",
    "Endpoint",
    "GateSlot",
    "MailDelivery",
    "MailRecipient",
    "OutboundEvent",
    "ProviderGate",
]
