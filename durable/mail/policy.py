"""Mail decisions as pure functions: the text, a stable Message-ID, SMTP error verdicts."""

from __future__ import annotations

import enum
import json
import smtplib
import ssl
import uuid
from dataclasses import dataclass
from typing import Any

from ..http.policy import cause_chain

_ID_NAMESPACE = uuid.UUID("0b8d7f0e-3f0c-4a51-b7b3-3a4f7f1c2b90")
MAX_SUBJECT_CHARS = 150
FOOTER = (
    "Delivery guarantee: at-least-once. If a worker stops between handing this message "
    "to the mail server and recording that, the message is sent again with the same "
    "Message-ID (most mail programs then show one copy) and the delivery record says "
    '"possibly sent twice".'
)


def message_id(event_id: str, recipient_id: int, sender: str) -> str:
    """Stable per (event, recipient): a resend carries the same Message-ID."""
    domain = sender.rpartition("@")[2].strip(" >") or "localhost"
    unique = uuid.uuid5(_ID_NAMESPACE, f"{event_id}\x00{recipient_id}")
    return f"<{unique}@{domain}>"


def compose(
    *, prefix: str, event_type: str, event_id: str, summary: str, payload: Any, created_at: str
) -> tuple[str, str]:
    """Subject and plain-text body. The subject is one line (header injection impossible)."""
    title = " ".join((summary or event_type).split())
    subject = f"[{prefix}] {title}" if prefix else title
    if len(subject) > MAX_SUBJECT_CHARS:
        subject = subject[: MAX_SUBJECT_CHARS - 1] + "…"
    details = json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    body = (
        f"{summary or event_type}\n\n"
        f"Event: {event_type}\nEvent id: {event_id}\nTime: {created_at}\n\n"
        f"{details}\n\n-- \n{FOOTER}\n"
    )
    return subject, body


class NothingSent(Exception):
    """``send_messages`` returned something other than 1 for our one message."""

    def __init__(self, count: object):
        super().__init__(f"the email backend reported {count!r} messages sent, not 1")


class MailVerdict(enum.StrEnum):
    RETRY = "retry"
    FAIL = "fail"
    PAUSE = "pause"  # a configuration problem an operator must fix (credentials)


@dataclass(frozen=True)
class SmtpOutcome:
    verdict: MailVerdict
    reason: str
    # True when the server answered with a reply code: it certainly did not take
    # the message. False (timeouts, dropped connections) means it might have.
    definite: bool


def classify_smtp_error(exc: BaseException) -> SmtpOutcome:
    """4xx replies and network trouble are retried; 5xx replies are verdicts.

    Authentication failures pause the job: retrying a wrong password only
    locks the account, and fixing it is an operator's task.
    """
    if isinstance(exc, NothingSent):
        return SmtpOutcome(MailVerdict.RETRY, "the email backend sent nothing", True)
    if isinstance(exc, smtplib.SMTPAuthenticationError):
        return SmtpOutcome(
            MailVerdict.PAUSE,
            f"SMTP authentication failed ({exc.smtp_code}): check EMAIL_HOST_USER and the "
            "password credential (DURABLE_MAIL_PASSWORD_REF), then resume the job",
            True,
        )
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        codes = sorted({code for code, _ in exc.recipients.values()})
        transient = any(400 <= code < 500 for code in codes)
        verdict = MailVerdict.RETRY if transient else MailVerdict.FAIL
        return SmtpOutcome(verdict, f"recipient refused by the mail server ({codes})", True)
    if isinstance(exc, smtplib.SMTPResponseException):
        code = exc.smtp_code
        verdict = MailVerdict.RETRY if 400 <= code < 500 else MailVerdict.FAIL
        kind = type(exc).__name__.removeprefix("SMTP")
        return SmtpOutcome(verdict, f"mail server refused: {kind} ({code})", True)
    if isinstance(exc, smtplib.SMTPNotSupportedError):
        return SmtpOutcome(MailVerdict.FAIL, "mail server lacks a required extension", True)
    if any(isinstance(item, ssl.SSLCertVerificationError) for item in cause_chain(exc)):
        return SmtpOutcome(MailVerdict.FAIL, "TLS certificate verification failed", True)
    if isinstance(exc, smtplib.SMTPServerDisconnected):
        return SmtpOutcome(MailVerdict.RETRY, "mail server disconnected", False)
    if isinstance(exc, TimeoutError):
        return SmtpOutcome(MailVerdict.RETRY, "mail server timed out", False)
    if isinstance(exc, ConnectionRefusedError):
        return SmtpOutcome(MailVerdict.RETRY, "mail server refused the connection", True)
    if isinstance(exc, OSError | smtplib.SMTPException):
        return SmtpOutcome(MailVerdict.RETRY, f"mail transport error ({type(exc).__name__})", False)
    return SmtpOutcome(MailVerdict.RETRY, f"unexpected {type(exc).__name__}", False)
