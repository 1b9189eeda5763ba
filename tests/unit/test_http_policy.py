"""Pure outbound-HTTP policy: classification, Retry-After, reset headers, jitter, redaction."""

import random
import socket
import ssl
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import httpcore
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from durable.http.errors import DnsLookupFailed, ResponseTooLarge, SsrfRefused
from durable.http.policy import (
    Verdict,
    body_excerpt,
    classify_exception,
    classify_status,
    cross_origin_drops,
    display_target,
    full_jitter,
    limit_spent,
    may_have_reached_server,
    parse_reset,
    parse_retry_after,
    redact_headers,
    retry_plan,
)
from tests.conftest import BASE_DIR

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
EPOCH_NOW = int(NOW.timestamp())


@pytest.mark.parametrize(
    ("status", "verdict"),
    [
        (200, Verdict.SUCCESS),
        (201, Verdict.SUCCESS),
        (204, Verdict.SUCCESS),
        (408, Verdict.RETRY),  # request timeout
        (425, Verdict.RETRY),  # too early
        (429, Verdict.RETRY),  # rate limited
        (500, Verdict.RETRY),
        (502, Verdict.RETRY),
        (503, Verdict.RETRY),
        (504, Verdict.RETRY),
        (301, Verdict.REDIRECT),
        (302, Verdict.REDIRECT),
        (303, Verdict.REDIRECT),
        (307, Verdict.REDIRECT),
        (308, Verdict.REDIRECT),
        (304, Verdict.FAIL),  # not modified: an answer to a conditional request, no redirect
        (300, Verdict.FAIL),  # multiple choices: nothing to follow
        (305, Verdict.FAIL),  # use proxy: deprecated, never followed
        (400, Verdict.FAIL),  # validation
        (401, Verdict.FAIL),  # authentication
        (403, Verdict.FAIL),  # authorization
        (404, Verdict.FAIL),  # not found
        (405, Verdict.FAIL),
        (409, Verdict.FAIL),  # conflict
        (410, Verdict.FAIL),
        (413, Verdict.FAIL),  # our body too large: repeating cannot help
        (422, Verdict.FAIL),  # validation
        (451, Verdict.FAIL),
        (501, Verdict.FAIL),  # not implemented: permanent
        (505, Verdict.FAIL),
        (100, Verdict.FAIL),  # nothing we asked for
    ],
)
def test_classify_status__table(status, verdict):
    assert classify_status(status).verdict is verdict


@pytest.mark.parametrize(
    ("status", "words"),
    [
        (401, "authentication"),
        (403, "not authorized"),
        (422, "invalid"),
        (404, "client error"),
    ],
)
def test_classify_status__names_the_class_of_4xx(status, words):
    assert words in classify_status(status).reason


def test_classify_status__304_says_what_it_is():
    assert "not modified" in classify_status(304).reason


def chained(outer: BaseException, *inner: BaseException) -> BaseException:
    """``outer`` raised from inner[0], raised from inner[1]… as httpx wraps httpcore wraps ssl."""
    current = outer
    for cause in inner:
        current.__cause__ = cause
        current = cause
    return outer


@pytest.mark.parametrize(
    ("exc", "verdict", "reason"),
    [
        (httpx.ConnectTimeout("t"), Verdict.RETRY, "connect timeout"),
        (httpx.ReadTimeout("t"), Verdict.RETRY, "read timeout"),
        (httpx.WriteTimeout("t"), Verdict.RETRY, "write timeout"),
        (httpx.PoolTimeout("t"), Verdict.RETRY, "connection pool timeout"),
        (httpx.ConnectError("[Errno 111] refused"), Verdict.RETRY, "connect error"),
        (
            chained(httpx.ConnectError("x"), DnsLookupFailed("nx")),
            Verdict.RETRY,
            "DNS lookup failed",
        ),
        (httpx.ReadError("[Errno 104] reset"), Verdict.RETRY, "connection reset"),
        (httpx.WriteError("broken pipe"), Verdict.RETRY, "connection reset"),
        (httpx.RemoteProtocolError("disconnected"), Verdict.RETRY, "connection closed"),
        (
            chained(
                httpx.ConnectError("x"),
                httpcore.ConnectError("x"),
                ssl.SSLCertVerificationError("CERTIFICATE_VERIFY_FAILED"),
            ),
            Verdict.FAIL,
            "TLS certificate verification failed",
        ),
        (httpx.UnsupportedProtocol("ftp"), Verdict.FAIL, "invalid URL"),
        (httpx.InvalidURL("bad"), Verdict.FAIL, "invalid URL"),
        (httpx.LocalProtocolError("bad header"), Verdict.FAIL, "invalid request"),
        (httpx.TooManyRedirects("loop"), Verdict.FAIL, "too many redirects"),
        (httpx.DecodingError("gzip"), Verdict.FAIL, "undecodable"),
        (
            SsrfRefused("no", host="h", address_class="loopback"),
            Verdict.FAIL,
            "SSRF",
        ),
        (ResponseTooLarge("big"), Verdict.FAIL, "response too large"),
        (ValueError("ours"), Verdict.FAIL, "unexpected ValueError"),
        (socket.gaierror("not an httpx error"), Verdict.FAIL, "unexpected gaierror"),
    ],
)
def test_classify_exception__table(exc, verdict, reason):
    result = classify_exception(exc)
    assert result.verdict is verdict
    assert reason in result.reason


@pytest.mark.parametrize(
    ("exc", "reached"),
    [
        (httpx.ConnectError("refused"), False),  # nothing left this machine
        (httpx.ConnectTimeout("t"), False),
        (httpx.PoolTimeout("t"), False),  # waited for a connection, never had one
        (chained(httpx.ConnectError("x"), DnsLookupFailed("nx")), False),
        (
            chained(httpx.ConnectError("x"), ssl.SSLCertVerificationError("bad")),
            False,
        ),
        (httpx.LocalProtocolError("Illegal header value"), False),  # refused before writing
        (httpx.InvalidURL("bad"), False),
        (SsrfRefused("no", host="h", address_class="loopback"), False),
        (httpx.ReadTimeout("t"), True),  # the request was written; the answer never came
        (httpx.ReadError("reset"), True),
        (httpx.WriteError("broken pipe"), True),  # part of it went out
        (httpx.WriteTimeout("t"), True),
        (httpx.RemoteProtocolError("disconnected"), True),
        (ResponseTooLarge("big", status=200, possibly_sent=True), True),  # a 2xx came back
        (ResponseTooLarge("big", status=404), False),
    ],
)
def test_may_have_reached_server__table(exc, reached):
    assert may_have_reached_server(exc) is reached


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120", NOW + timedelta(seconds=120)),  # delta seconds
        ("0", NOW),  # "now" is valid
        (" 7 ", NOW + timedelta(seconds=7)),
        ("1.5", NOW + timedelta(seconds=1.5)),  # tolerated fraction
        ("Tue, 01 Dec 2026 12:05:00 GMT", NOW + timedelta(minutes=5)),  # IMF-fixdate
        ("Tuesday, 01-Dec-26 12:05:00 GMT", NOW + timedelta(minutes=5)),  # RFC 850
        ("Tue Dec  1 12:05:00 2026", NOW + timedelta(minutes=5)),  # asctime
        ("86400", NOW + timedelta(days=1)),  # exactly the ceiling
        ("86401", None),  # beyond the ceiling: absurd, ignored
        ("Wed, 01 Dec 2027 12:00:00 GMT", None),  # a year away
        ("-5", None),  # negative
        ("+5", None),
        ("1e3", None),
        ("soon", None),  # garbage
        ("", None),
        (None, None),
        ("Tue, 01 Dec 2026 11:59:00 GMT", None),  # in the past
        ("Tue, 01 Dec 2026 12:00:00 GMT", None),  # exactly now is not in the future
        ("Tue, 32 Dec 2026 12:05:00 GMT", None),  # impossible date
        ("120 seconds", None),
    ],
)
def test_parse_retry_after__table(value, expected):
    assert parse_retry_after(value, now=NOW) == expected


def test_parse_retry_after__ceiling_is_configurable():
    assert parse_retry_after("600", now=NOW, ceiling=300) is None
    assert parse_retry_after("300", now=NOW, ceiling=300) == NOW + timedelta(seconds=300)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (str(EPOCH_NOW + 90), NOW + timedelta(seconds=90)),  # epoch seconds (GitHub)
        (f"{EPOCH_NOW + 90}.5", NOW + timedelta(seconds=90.5)),
        ("30", NOW + timedelta(seconds=30)),  # delta seconds (IETF RateLimit-Reset)
        (str(EPOCH_NOW - 10), None),  # epoch in the past
        ("0", None),  # nothing to wait for
        ("-30", None),
        ("tomorrow", None),
        (str(EPOCH_NOW + 10 * 86400), None),  # beyond the ceiling
        (None, None),
    ],
)
def test_parse_reset__table(value, expected):
    assert parse_reset(value, now=NOW) == expected


@pytest.mark.parametrize(
    ("status", "headers", "spent"),
    [
        (429, {}, True),
        (503, {}, True),
        (502, {"X-RateLimit-Remaining": "0"}, True),
        (500, {"ratelimit-remaining": " 0 "}, True),
        (502, {"X-RateLimit-Remaining": "4999"}, False),
        (500, {}, False),
    ],
)
def test_limit_spent__table(status, headers, spent):
    assert limit_spent(status, headers) is spent


def plan(status=None, headers=None, attempt=1, seed=0):
    return retry_plan(
        attempt=attempt,
        now=NOW,
        status=status,
        headers=headers or {},
        backoff_base=2,
        backoff_max=60,
        rng=random.Random(seed),
    )


def test_retry_plan__valid_retry_after_is_authoritative():
    result = plan(503, {"Retry-After": "120"})
    assert (result.at, result.source) == (NOW + timedelta(seconds=120), "retry-after")
    result = plan(429, {"retry-after": "Tue, 01 Dec 2026 12:05:00 GMT"})
    assert result.at == NOW + timedelta(minutes=5)


@pytest.mark.parametrize(
    "value", ["garbage", "-1", "Tue, 01 Dec 2026 11:00:00 GMT", "99999999", ""]
)
def test_retry_plan__invalid_retry_after_falls_back_to_capped_backoff(value):
    for attempt in (1, 3, 9):
        result = plan(503, {"Retry-After": value}, attempt=attempt)
        assert result.source == "backoff"
        assert NOW <= result.at <= NOW + timedelta(seconds=min(60, 2 * 2 ** (attempt - 1)))


def test_retry_plan__reset_header_extends_the_delay():
    reset = str(EPOCH_NOW + 600)
    result = plan(429, {"Retry-After": "30", "X-RateLimit-Reset": reset})
    assert (result.at, result.source) == (NOW + timedelta(seconds=600), "retry-after+reset")
    result = plan(429, {"RateLimit-Reset": "45"})
    assert (result.at, result.source) == (NOW + timedelta(seconds=45), "backoff+reset")


def test_retry_plan__reset_header_never_shortens_the_delay():
    result = plan(429, {"Retry-After": "300", "X-RateLimit-Reset": str(EPOCH_NOW + 20)})
    assert (result.at, result.source) == (NOW + timedelta(seconds=300), "retry-after")
    result = plan(429, {"Retry-After": "300", "RateLimit-Reset": "5"})
    assert result.at == NOW + timedelta(seconds=300)


def test_retry_plan__reset_ignored_while_quota_remains():
    # GitHub sends a reset time on every response; a 502 with quota left must not wait an hour.
    headers = {"X-RateLimit-Reset": str(EPOCH_NOW + 3600), "X-RateLimit-Remaining": "4000"}
    assert plan(502, headers).source == "backoff"
    headers["X-RateLimit-Remaining"] = "0"
    assert plan(502, headers).at == NOW + timedelta(seconds=3600)


@pytest.mark.parametrize(
    ("value", "delay"),
    [
        ("0", 1.0),  # "now": a floor of 1 s, not a burst of back-to-back attempts
        ("0.2", 1.0),
        ("1", 1.0),
        ("2.5", 2.5),  # above the floor: as the server said
        ("Tue, 01 Dec 2026 12:00:01 GMT", 1.0),
    ],
)
def test_retry_plan__retry_after_has_a_small_floor(value, delay):
    result = plan(429, {"Retry-After": value})
    assert (result.delay(NOW), result.source) == (delay, "retry-after")


def test_retry_plan__transport_errors_use_backoff_only():
    result = plan(None, {})
    assert result.source == "backoff"
    assert NOW <= result.at <= NOW + timedelta(seconds=2)


@given(
    attempt=st.integers(min_value=1, max_value=500),
    base=st.floats(min_value=0.001, max_value=60),
    cap=st.floats(min_value=0.001, max_value=3600),
    seed=st.integers(),
)
def test_jitter__every_delay_within_zero_and_the_cap(attempt, base, cap, seed):
    delay = full_jitter(attempt, base=base, cap=cap, rng=random.Random(seed))
    assert 0 <= delay <= cap
    assert delay <= base * 2 ** min(attempt - 1, 62)
    planned = retry_plan(
        attempt=attempt,
        now=NOW,
        status=503,
        headers={},
        backoff_base=base,
        backoff_max=cap,
        rng=random.Random(seed),
    )
    assert 0 <= planned.delay(NOW) <= cap + 1e-6


@given(seed=st.integers())
def test_jitter__distribution_is_not_constant(seed):
    rng = random.Random(seed)
    delays = [full_jitter(6, base=1, cap=30, rng=rng) for _ in range(100)]
    assert len({round(d, 6) for d in delays}) > 90
    # Spread across the window [0, 30], not bunched at the top like "±10 %" jitter.
    assert min(delays) < 10
    assert max(delays) > 20


@pytest.mark.parametrize(
    ("name", "redacted"),
    [
        ("Authorization", True),
        ("authorization", True),
        ("Proxy-Authorization", True),
        ("Cookie", True),
        ("Set-Cookie", True),
        ("X-Api-Key", True),
        ("X-Auth-Token", True),
        ("Api-Key", True),
        ("X-Signature", True),
        ("Content-Type", False),
        ("Idempotency-Key", False),
        ("Retry-After", False),
        ("X-RateLimit-Remaining", False),
    ],
)
def test_redact_headers__table(name, redacted):
    out = redact_headers({name: "value-1234"})
    assert (out[name] == "[redacted]") is redacted


def test_display_target__never_shows_path_or_query():
    assert display_target("post", "hooks.example.com", 8443) == "POST hooks.example.com:8443"
    assert display_target("GET", "api.example.com") == "GET api.example.com"


JWT = "eyJhbGciOiJIUzI1NiJ9." + "eyJzdWIiOiIxMjM0NTY3ODkwIn0" * 34 + ".c2lnbmF0dXJl"  # ~960 chars


def pieces(secret: str, size: int = 12) -> list[str]:
    """Every ``size``-character window of ``secret``: none may survive anywhere."""
    return [secret[i : i + size] for i in range(0, len(secret) - size + 1)]


@pytest.mark.parametrize(
    ("body", "complete"),
    [
        (f"bad auth Bearer {JWT} more", True),  # the token starts inside the excerpt
        (f"{'x' * 250} Bearer {JWT}", True),  # and ends long after its 300 bytes
        (f"{' ' * 5000}{JWT}", True),  # whitespace collapses: the token moves forward
        (f"error: {JWT[:500]}", False),  # a partial read ended in the middle of it
        (f"error: {JWT[:5]}", False),
    ],
)
def test_body_excerpt__no_piece_of_a_long_secret_survives(body, complete):
    shown = body_excerpt(body.encode(), {JWT}, complete=complete)
    assert len(shown.encode()) <= 300
    assert not [piece for piece in pieces(JWT) if piece in shown]


def test_body_excerpt__redacts_collapses_and_cuts():
    shown = body_excerpt(b"line one\n\tline two token-1234 " + b"z" * 1000, {"token-1234"})
    assert shown.startswith("line one line two [redacted] zzz")
    assert len(shown.encode()) <= 300
    assert body_excerpt(b"say  pass  word  here", {"pass  word"}) == "say [redacted] here"


def test_body_excerpt__a_complete_body_keeps_a_coincidental_ending():
    # Only a partial body can end in a cut secret; a complete one is shown as it is.
    assert body_excerpt(b"status: eyJh", {JWT}) == "status: eyJh"
    assert body_excerpt(b"status: eyJh", {JWT}, complete=False) == "status:"


@pytest.mark.parametrize(
    ("headers", "dropped"),
    [
        ([("Authorization", "Bearer x")], ["Authorization"]),
        ([("X-Api-Key", "k-1234")], ["X-Api-Key"]),  # named like a credential
        ([("X-Signature", "t=1,v1=ab")], ["X-Signature"]),
        (
            [("Cookie", "a=b"), ("Proxy-Authorization", "Basic x")],
            ["Cookie", "Proxy-Authorization"],
        ),
        ([("X-Custom-Auth", "whatever")], ["X-Custom-Auth"]),  # the provider's auth_header
        ([("X-Tenant", "acme s3cr3t-value")], ["X-Tenant"]),  # carries a resolved secret
        ([("Content-Type", "application/json"), ("Idempotency-Key", "k")], []),
        ([("User-Agent", "durable-http/1"), ("Accept", "*/*")], []),
    ],
)
def test_cross_origin_drops__table(headers, dropped):
    found = cross_origin_drops(headers, auth_header="x-custom-auth", secrets={"s3cr3t-value"})
    assert found == dropped


def test_classify__a_process_that_never_imported_httpx_does_not_import_it_to_classify():
    """The policy asks for httpx only if loaded: a worker starts without it (~40 ms sooner)."""
    code = (
        "import sys\n"
        "from durable.http.errors import DnsLookupFailed\n"
        "from durable.http.policy import classify_exception as classify, may_have_reached_server\n"
        "assert classify(ValueError('x')).reason == 'unexpected ValueError'\n"
        "assert classify(DnsLookupFailed('x')).verdict.name == 'RETRY'\n"
        "assert may_have_reached_server(ValueError('x'))\n"
        "assert not may_have_reached_server(DnsLookupFailed('x'))\n"
        "assert 'httpx' not in sys.modules, 'the policy imported httpx'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=BASE_DIR
    )
    assert done.returncode == 0, done.stderr
