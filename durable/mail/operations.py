"""``durable.mail``: send one mail delivery through Django's email backend, at-least-once.

The unit, for a delivery not yet sent:

1. opens the backend's connection (a failure here certainly sent nothing);
2. marks the record ``sending`` in its own commit (fenced by the lease);
3. sends (``faults.reach("mail_after_send")`` follows, for crash tests);
4. marks it ``sent``.

A replay that finds ``sending`` knows a previous attempt got past step 2 and
never reached step 4: the message may or may not have gone out. It records
``possibly_duplicate`` (and a ``possibly_sent_twice`` job event) and sends
again — reported, never hidden. A timeout or dropped connection during step 3
leaves ``sending`` for the same reason; a reply code (4xx/5xx) proves the
server refused, so the record goes back to ``pending`` or to ``failed``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NoReturn

from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.core.mail.backends.base import BaseEmailBackend
from django.db.models import F
from django.utils import timezone
from django.utils.module_loading import import_string

from .. import faults, notify
from ..errors import InputRejected, NonRetryable, Unavailable
from ..models.mail import MailDelivery, MailState
from ..operations import Access, JobContext, Operation, Unit, register
from ..states import JobState
from .policy import MailVerdict, NothingSent, classify_smtp_error, compose


class MailNotSent(Exception):
    """A transient SMTP failure: the engine retries with the operation's backoff."""


def _delivery(ctx: JobContext) -> MailDelivery:
    try:
        return MailDelivery.objects.select_related("event").get(pk=ctx.input["delivery_id"])
    except MailDelivery.DoesNotExist:
        raise NonRetryable(f"mail delivery {ctx.input['delivery_id']} no longer exists") from None


def _password(ctx: JobContext) -> str | None:
    ref = getattr(settings, "DURABLE_MAIL_PASSWORD_REF", "")
    return ctx.credential(ref) if ref else None


SMTP_BACKEND = "django.core.mail.backends.smtp.EmailBackend"


def mailer(overrides: dict[str, Any]) -> BaseEmailBackend:
    """The site's default mailer, with the SMTP password resolved at send time.

    Django 6.1 configures mail with ``MAILERS`` and deprecates the ``EMAIL_*``
    settings; Django 5.2 knows only those. A site that defines ``MAILERS`` gets its
    ``"default"`` mailer, built as ``django.core.mail.mailers`` builds it (which has
    no way to add a password per send); any other site gets ``get_connection()``,
    which reads ``EMAIL_*``. No deprecation warning on either line.
    """
    configured = getattr(settings, "MAILERS", None)
    if configured is None:
        return get_connection(fail_silently=False, **overrides)
    config = configured.get("default") or {}
    backend = import_string(config.get("BACKEND", SMTP_BACKEND))
    return backend(alias="default", **{**config.get("OPTIONS", {}), **overrides})


@register
class SendMail(Operation):
    name = notify.MAIL_OPERATION
    label = "Send a notification mail"
    description = "Send one event to one recipient through the email backend; at-least-once."
    max_attempts = 8
    backoff_base = 10.0
    backoff_max = 1800.0
    on_exhausted = JobState.FAILED
    unit_timeout = 600.0
    access = Access.SYSTEM  # ``publish`` and ``resend_mail`` enqueue it; nobody starts it by hand

    def clean_input(self, data: dict[str, Any]) -> dict[str, Any]:
        delivery_id = data.get("delivery_id")
        if not isinstance(delivery_id, int) or isinstance(delivery_id, bool) or delivery_id < 1:
            raise InputRejected("delivery_id", "must be the id of a mail delivery")
        return {"delivery_id": delivery_id}

    def prepare(self, ctx: JobContext) -> None:
        _delivery(ctx)
        _password(ctx)  # a missing SMTP password credential pauses the job

    def total_units(self, ctx: JobContext) -> int:
        return 1

    def units(self, ctx: JobContext) -> Iterator[Unit]:
        if not ctx.checkpoint:
            yield Unit(key="send", payload=ctx.input, checkpoint={"sent": True})

    def run_unit(self, ctx: JobContext, unit: Unit) -> dict[str, Any]:
        delivery = _delivery(ctx)
        records = MailDelivery.objects.filter(pk=delivery.pk)
        if delivery.state == MailState.SENT:
            return {"sent": True, "already_sent": True}
        if delivery.state == MailState.SENDING:
            note = (
                "possibly sent twice: an earlier attempt started sending and never recorded "
                "the outcome; sending again (at-least-once)"
            )
            notify.fenced_update(ctx, records, possibly_duplicate=True, last_error=note)
            ctx.event("possibly_sent_twice", note, delivery_id=delivery.pk)
        event = delivery.event
        subject, body = compose(
            prefix=getattr(settings, "DURABLE_MAIL_SUBJECT_PREFIX", "durable"),
            event_type=event.event_type,
            event_id=event.event_id,
            summary=event.summary,
            payload=event.payload,
            created_at=event.created_at.isoformat(),
        )
        connection = mailer(self._auth(ctx))
        message = EmailMessage(
            subject,
            body,
            notify.sender_address(),
            [delivery.address],
            headers={"Message-ID": delivery.message_id, "X-Durable-Event-Id": event.event_id},
        )  # sent by connection.send_messages below (Django 6.1 deprecates connection=)
        try:
            connection.open()
        except Exception as exc:
            self._fail(ctx, records, exc, sending=False)
        try:
            notify.fenced_update(
                ctx,
                records,
                state=MailState.SENDING,
                send_attempts=F("send_attempts") + 1,
                last_attempt_at=timezone.now(),
            )
            try:
                sent = connection.send_messages([message])
            except Exception as exc:
                self._fail(ctx, records, exc, sending=True)
            if sent != 1:
                # A backend that reports nothing sent (fail_silently, a filtering or custom
                # backend) has not sent it: say so instead of recording "sent".
                self._fail(ctx, records, NothingSent(sent), sending=True)
        finally:
            connection.close()
        faults.reach("mail_after_send")  # the server has it; our record does not yet
        notify.fenced_update(ctx, records, state=MailState.SENT, sent_at=timezone.now())
        return {"sent": True}

    def _auth(self, ctx: JobContext) -> dict[str, Any]:
        password = _password(ctx)
        return {} if password is None else {"password": password}

    def _fail(self, ctx: JobContext, records: Any, exc: Exception, *, sending: bool) -> NoReturn:
        outcome = classify_smtp_error(exc)
        reason = notify.last_error(f"{outcome.reason}: {exc}", ctx.secrets)
        exhausted = ctx.attempt >= notify.max_attempts(ctx.job_id)
        if outcome.verdict is MailVerdict.FAIL:
            state = MailState.FAILED
        elif sending and not outcome.definite:
            state = MailState.SENDING  # the server may have taken it: a replay will say so
        elif exhausted and outcome.verdict is MailVerdict.RETRY:
            state = MailState.EXHAUSTED
        else:
            state = MailState.PENDING
        notify.fenced_update(ctx, records, state=state, last_error=reason)
        if outcome.verdict is MailVerdict.FAIL:
            raise NonRetryable(reason) from exc
        if outcome.verdict is MailVerdict.PAUSE:
            raise Unavailable(reason) from exc
        raise MailNotSent(reason) from exc  # retried with the operation's backoff
