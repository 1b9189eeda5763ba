"""Pure webhook and mail decisions: filters, keys, signatures, SMTP verdicts, message text."""

import re
import smtplib
import ssl
from pathlib import Path

import pytest

from durable.mail.policy import (
    FOOTER,
    MAX_SUBJECT_CHARS,
    MailVerdict,
    NothingSent,
    classify_smtp_error,
    compose,
    message_id,
)
from durable.operations import get_operation, may_start
from durable.webhooks.policy import body, content_id, idempotency_key, matches, signature, verify

WEBHOOKS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "webhooks-and-mail.md"


@pytest.mark.parametrize(
    ("patterns", "event_type", "matched"),
    [
        ([], "job.failed", True),  # empty filter: everything
        (None, "anything", True),
        (["job.*"], "job.failed", True),
        (["job.*"], "recovery.backup-created", False),
        (["recovery.corruption-*", "job.paused"], "job.paused", True),
        (["JOB.*"], "job.failed", False),  # case-sensitive, like event types
        (["job.failed"], "job.failed.extra", False),
        (["", "  "], "job.failed", True),  # blank patterns are ignored
    ],
)
def test_event_filter__table(patterns, event_type, matched):
    assert matches(patterns, event_type) is matched


def test_idempotency_key__stable_per_event_and_destination():
    assert idempotency_key("e1", "hook:1") == idempotency_key("e1", "hook:1")
    keys = {idempotency_key(e, d) for e in ("e1", "e2") for d in ("hook:1", "hook:2")}
    assert len(keys) == 4
    # No separator ambiguity: ("a", "bc") and ("ab", "c") differ.
    assert idempotency_key("a", "bc") != idempotency_key("ab", "c")


def test_body__is_canonical_json_and_byte_stable():
    one = body(event_id="e", event_type="t", created_at="c", summary="s", data={"b": 1, "a": "é"})
    two = body(event_id="e", event_type="t", created_at="c", summary="s", data={"a": "é", "b": 1})
    assert one == two
    assert one.startswith(b'{"created_at":"c","data":{"a":"\xc3\xa9","b":1}')


def test_signature__verifies_and_detects_tampering_and_replay():
    payload = b'{"id":"e1"}'
    header = signature("s3cret-key", 1_800_000_000, payload)
    assert re.fullmatch(r"t=1800000000,v1=[0-9a-f]{64}", header)
    assert verify("s3cret-key", header, payload, now=1_800_000_010)
    assert not verify("s3cret-key", header, payload + b" ", now=1_800_000_010)  # body changed
    assert not verify("other-key", header, payload, now=1_800_000_010)  # wrong secret
    assert not verify("s3cret-key", header, payload, now=1_800_000_000 + 301)  # too old
    forged = header.replace("t=1800000000", "t=1800000300")  # fresh time, old signature
    assert not verify("s3cret-key", forged, payload, now=1_800_000_300)
    assert not verify("s3cret-key", "garbage", payload, now=1_800_000_000)
    assert not verify("s3cret-key", "", payload, now=1_800_000_000)


def test_signature__receivers_may_accept_several_v1_values_during_secret_rotation():
    payload = b"{}"
    old = signature("old-secret", 1_800_000_000, payload)
    both = old + "," + signature("new-secret", 1_800_000_000, payload).split(",")[1]
    assert verify("new-secret", both, payload, now=1_800_000_000)
    assert verify("old-secret", both, payload, now=1_800_000_000)


def test_readme_verification_example__accepts_our_signature_and_rejects_a_forgery():
    """The receiver example in the docs is real code: run it against what we send."""
    text = WEBHOOKS_PAGE.read_text()
    section = text.split("## Verifying a webhook", 1)[1]
    code = section.split("```python", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(code, str(WEBHOOKS_PAGE), "exec"), namespace)  # noqa: S102 - our own docs example
    verify_webhook = namespace["verify_webhook"]
    payload = b'{"id":"job:1:5","type":"job.failed"}'
    import time

    header = signature("whsec-example", int(time.time()), payload)
    assert verify_webhook(payload, header, "whsec-example") is True
    assert verify_webhook(payload + b"x", header, "whsec-example") is False
    stale = signature("whsec-example", int(time.time()) - 3600, payload)
    assert verify_webhook(payload, stale, "whsec-example") is False


def test_content_id__stable_for_equal_content():
    assert content_id({"a": 1, "b": [1, 2]}) == content_id({"b": [1, 2], "a": 1})
    assert content_id({"a": 1}) != content_id({"a": 2})


def refused(code: int) -> smtplib.SMTPRecipientsRefused:
    return smtplib.SMTPRecipientsRefused({"a@example.com": (code, b"no")})


@pytest.mark.parametrize(
    ("exc", "verdict", "definite"),
    [
        (smtplib.SMTPAuthenticationError(535, b"bad credentials"), MailVerdict.PAUSE, True),
        (refused(550), MailVerdict.FAIL, True),  # no such mailbox
        (refused(452), MailVerdict.RETRY, True),  # mailbox full for now
        (smtplib.SMTPSenderRefused(553, b"no", "from@x"), MailVerdict.FAIL, True),
        (smtplib.SMTPDataError(554, b"spam"), MailVerdict.FAIL, True),
        (smtplib.SMTPDataError(451, b"try later"), MailVerdict.RETRY, True),
        (smtplib.SMTPHeloError(421, b"busy"), MailVerdict.RETRY, True),
        (smtplib.SMTPNotSupportedError("STARTTLS"), MailVerdict.FAIL, True),
        (ssl.SSLCertVerificationError("bad cert"), MailVerdict.FAIL, True),
        (ConnectionRefusedError(111, "refused"), MailVerdict.RETRY, True),
        # The server may have taken the message: a replay must say "possibly sent twice".
        (smtplib.SMTPServerDisconnected("gone"), MailVerdict.RETRY, False),
        (TimeoutError("timed out"), MailVerdict.RETRY, False),
        (ConnectionResetError(104, "reset"), MailVerdict.RETRY, False),
        (RuntimeError("surprise"), MailVerdict.RETRY, False),
        (NothingSent(0), MailVerdict.RETRY, True),  # the backend said it sent nothing
    ],
)
def test_classify_smtp_error__table(exc, verdict, definite):
    outcome = classify_smtp_error(exc)
    assert (outcome.verdict, outcome.definite) == (verdict, definite)


def test_compose__one_line_subject_and_an_explicit_guarantee():
    subject, text = compose(
        prefix="ops",
        event_type="job.failed",
        event_id="job:1:4",
        summary="backup job 1 failed:\r\nBcc: victim@example.com " + "x" * 400,
        payload={"job_id": 1},
        created_at="2026-12-01T12:00:00+00:00",
    )
    assert "\n" not in subject
    assert "\r" not in subject
    assert subject.startswith("[ops] backup job 1 failed: Bcc:")
    assert len(subject) <= MAX_SUBJECT_CHARS
    assert '"job_id": 1' in text
    assert FOOTER in text
    assert "at-least-once" in text


def test_message_id__stable_per_event_and_recipient():
    one = message_id("job:1:4", 7, "Ops <ops@example.com>")
    assert one == message_id("job:1:4", 7, "Ops <ops@example.com>")
    assert one != message_id("job:1:4", 8, "Ops <ops@example.com>")
    assert re.fullmatch(r"<[0-9a-f-]{36}@example\.com>", one)


def test_published_checkpoint__is_bounded():
    from durable.notify import MAX_CHECKPOINT_CHARS, _bounded_json

    assert _bounded_json({"next": 5}) == {"next": 5}
    huge = _bounded_json({"ids": list(range(100_000))})
    assert len(huge["truncated"]) == MAX_CHECKPOINT_CHARS


@pytest.mark.parametrize("operation", ["durable.webhook", "durable.mail"])
def test_delivery_operations__are_enqueued_by_the_site_never_by_hand(operation):
    # publish / redeliver / resend_mail enqueue them; may_start says no to everyone else.
    op = get_operation(operation)
    assert op.access == "system"
    assert may_start(op, privileged=True) is False
