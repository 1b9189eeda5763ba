"""The outbound client against real local servers: timeouts, resets, statuses, limits, SSRF, TLS."""

from __future__ import annotations

import gzip
import logging
import socket
import time
import traceback
from datetime import timedelta
from email.utils import format_datetime

import httpx
import pytest
from django.utils import timezone

from durable import signals
from durable.errors import NonRetryable
from durable.http import client as http_client
from durable.http.addresses import KINDS
from durable.http.errors import (
    HttpRetryLater,
    HttpStatusError,
    RedirectNotFollowed,
    ResponseTooLarge,
    SsrfRefused,
    TransportFailed,
    UndecodableBody,
)
from durable.policy import error_entry

from ..servers import HttpServer, Reply, make_tls

# A JWT-like bearer token of about 960 characters (the audit's case).
LONG_TOKEN = "eyJhbGciOiJSUzI1NiJ9." + "eyJzdWIiOiJ1c2VyLTEyMyJ9" * 38 + ".c2lnbmF0dXJlLXBhcnQ"


def pieces(secret: str, size: int = 12) -> list[str]:
    """Every ``size``-character window of ``secret``: none may survive anywhere."""
    return [secret[i : i + size] for i in range(0, len(secret) - size + 1)]


def leaked(secret: str, *texts: str) -> list[str]:
    return [piece for piece in pieces(secret) for text in texts if piece in text]


def call(url: str, name: str = "test", **kwargs):
    return http_client.client(name).request(kwargs.pop("method", "GET"), url, **kwargs)


def test_request__returns_the_body_and_identifies_itself(http_server, provider):
    provider()
    http_server.reply("/hello", Reply(200, {"Content-Type": "text/plain"}, b"hello there"))
    response = call(http_server.url("/hello"))
    assert (response.status, response.content) == (200, b"hello there")
    [seen] = http_server.requests("/hello")
    assert seen.header("User-Agent") == "durable-http/1"
    assert seen.header("Accept-Encoding") == "identity"


def test_request__keeps_one_long_lived_client_per_provider(http_server, provider):
    provider()
    assert http_client.client("test") is http_client.client("test")
    provider(total_timeout=3)  # settings changed: a new client with the new limits
    assert http_client.client("test").config.total_timeout == 3


# --- timeouts and resets -------------------------------------------------------------


def test_connect_timeout__is_retryable_and_bounded(black_hole, provider):
    provider(connect_timeout=0.5, total_timeout=5)
    started = time.monotonic()
    with pytest.raises(HttpRetryLater, match="connect timeout") as info:
        call(f"http://127.0.0.1:{black_hole.port}/")
    assert time.monotonic() - started < 3
    assert info.value.consume_attempt is True


def test_total_timeout__a_slow_drip_cannot_keep_us_past_the_deadline(http_server, provider):
    provider(total_timeout=1.0)
    http_server.reply("/drip", Reply(drip=0.05))  # a byte every 50 ms, 100 kB promised
    started = time.monotonic()
    with pytest.raises(HttpRetryLater, match="total timeout of 1s exceeded"):
        call(http_server.url("/drip"))
    elapsed = time.monotonic() - started
    assert 0.9 < elapsed < 2.5
    [record] = http_server.requests("/drip")
    assert record.bytes_sent < 100  # we stopped reading long before the body ended


def test_total_timeout__covers_a_server_that_never_finishes_its_headers(http_server, provider):
    provider(total_timeout=1.0)
    # A header line every 100 ms, for 30 s: no read waits anywhere near the 1 s read
    # timeout, so only the whole-exchange deadline can stop the client.
    http_server.reply("/stall", Reply(drip_headers=0.1))
    started = time.monotonic()
    with pytest.raises(HttpRetryLater, match="total timeout of 1s exceeded"):
        call(http_server.url("/stall"))
    assert time.monotonic() - started < 2.5
    [record] = http_server.requests("/stall")
    assert 3 <= record.bytes_sent < 25  # header lines did arrive, and we stopped early


def test_connection_reset_mid_response__is_retryable(http_server, provider):
    provider()
    http_server.reply("/reset", Reply(body=b"x" * 5000, reset_after=100))
    with pytest.raises(HttpRetryLater) as info:
        call(http_server.url("/reset"))
    assert "connection reset" in str(info.value) or "connection closed" in str(info.value)
    assert info.value.status is None


def test_dns_failure__is_retryable(provider, make_client):
    provider(allow_hosts=[])

    def no_such_host(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    client = make_client(resolver=no_such_host)
    with pytest.raises(HttpRetryLater, match="DNS lookup failed"):
        client.request("GET", "http://no-such-host.test/")


# --- statuses and retry timing ------------------------------------------------------------


@pytest.mark.parametrize("status", [408, 425, 429, 500, 502, 503, 504])
def test_retryable_status__raises_retry_later_with_a_backoff_time(http_server, provider, status):
    provider(backoff_base=0.5, backoff_max=4)
    http_server.reply("/s", Reply(status, body=b"busy"))
    before = timezone.now()
    with pytest.raises(HttpRetryLater) as info:
        call(http_server.url("/s"), attempt=3)
    exc = info.value
    assert (exc.status, exc.consume_attempt, exc.source) == (status, True, "backoff")
    assert before <= exc.at <= timezone.now() + timedelta(seconds=2)  # 0.5·2² = 2 s at most


@pytest.mark.parametrize(
    "status",
    [
        400,  # validation
        401,  # authentication
        403,  # authorization
        404,  # not found
        405,
        409,  # conflict
        410,
        413,
        422,  # validation
        501,
    ],
)
def test_non_retryable_status__is_a_verdict_with_a_bounded_excerpt(http_server, provider, status):
    provider()
    http_server.reply("/s", Reply(status, body=b"nope " * 2000))
    with pytest.raises(HttpStatusError) as info:
        call(http_server.url("/s"))
    assert isinstance(info.value, NonRetryable)
    assert info.value.status == status
    assert len(info.value.excerpt.encode()) <= 300
    assert len(str(info.value).encode()) < 600


def test_accepted_status__is_returned_to_the_caller(http_server, provider):
    provider()
    http_server.reply("/gone", Reply(404, body=b"gone"))
    assert call(http_server.url("/gone"), accept=(404,)).status == 404


def test_retry_after__delta_seconds_is_authoritative_and_the_client_does_not_sleep(
    http_server, provider
):
    provider()
    http_server.reply("/s", Reply(503, {"Retry-After": "120"}))
    before, started = timezone.now(), time.monotonic()
    with pytest.raises(HttpRetryLater) as info:
        call(http_server.url("/s"))
    assert time.monotonic() - started < 2  # the wait is the job's next_attempt_at, not a sleep
    assert info.value.source == "retry-after"
    assert (
        before + timedelta(seconds=119) <= info.value.at <= timezone.now() + timedelta(seconds=121)
    )


def test_retry_after__http_date_is_authoritative(http_server, provider):
    provider()
    when = (timezone.now() + timedelta(seconds=300)).replace(microsecond=0)
    http_server.reply("/s", Reply(429, {"Retry-After": format_datetime(when, usegmt=True)}))
    with pytest.raises(HttpRetryLater) as info:
        call(http_server.url("/s"))
    assert (info.value.at, info.value.source) == (when, "retry-after")


@pytest.mark.parametrize("value", ["soon", "-30", "Mon, 01 Jan 2001 00:00:00 GMT", "9999999999"])
def test_retry_after__invalid_values_fall_back_to_backoff(http_server, provider, value):
    provider(backoff_base=0.1, backoff_max=0.4)
    http_server.reply("/s", Reply(503, {"Retry-After": value}))
    with pytest.raises(HttpRetryLater) as info:
        call(http_server.url("/s"), attempt=5)
    assert info.value.source == "backoff"
    assert info.value.at <= timezone.now() + timedelta(seconds=0.4)


def test_reset_header__extends_the_wait(http_server, provider):
    provider()
    reset = int(time.time()) + 100
    http_server.reply("/s", Reply(429, {"Retry-After": "10", "X-RateLimit-Reset": str(reset)}))
    with pytest.raises(HttpRetryLater) as info:
        call(http_server.url("/s"))
    assert info.value.source == "retry-after+reset"
    assert abs(info.value.at.timestamp() - reset) < 0.01


def test_reset_header__never_shortens_the_wait(http_server, provider):
    provider()
    soon = int(time.time()) + 5
    http_server.reply("/s", Reply(429, {"Retry-After": "60", "X-RateLimit-Reset": str(soon)}))
    before = timezone.now()
    with pytest.raises(HttpRetryLater) as info:
        call(http_server.url("/s"))
    assert info.value.source == "retry-after"
    assert info.value.at >= before + timedelta(seconds=59)


# --- bounded bodies ------------------------------------------------------------------------


def test_body_limit__a_declared_oversized_body_is_refused_unread(http_server, provider):
    provider(max_body_bytes=10_000)
    http_server.reply("/big", Reply(body=b"B" * 50_000))
    with pytest.raises(ResponseTooLarge, match="declared 50000 bytes"):
        call(http_server.url("/big"))


def test_body_limit__an_endless_stream_is_cut_at_the_limit(http_server, provider):
    provider(max_body_bytes=100_000, total_timeout=10)
    http_server.reply("/stream", Reply(stream_bytes=200 * 1024 * 1024))
    with pytest.raises(ResponseTooLarge, match="more than 100000 bytes") as info:
        call(http_server.url("/stream"))
    assert isinstance(info.value, NonRetryable)
    assert info.value.excerpt == ""  # nothing of it is kept
    [record] = http_server.requests("/stream")
    # We stopped reading: only what fit in the socket buffers left the server.
    assert record.bytes_sent < 32 * 1024 * 1024


def test_body_limit__applies_after_decompression(http_server, provider):
    provider(max_body_bytes=100_000)
    bomb = gzip.compress(b"\0" * 20_000_000)  # ~20 kB that inflate to 20 MB
    http_server.reply("/bomb", Reply(headers={"Content-Encoding": "gzip"}, body=bomb))
    with pytest.raises(ResponseTooLarge):
        call(http_server.url("/bomb"))
    small = gzip.compress(b"fine")
    http_server.reply("/gz", Reply(headers={"Content-Encoding": "gzip"}, body=small))
    assert call(http_server.url("/gz")).content == b"fine"


def test_error_status__a_large_body_is_classified_by_its_status(http_server, provider):
    provider(max_body_bytes=10_000)
    huge = b"busy " * 1_000_000  # 5 MB, declared in Content-Length
    http_server.reply("/declared", Reply(503, {"Retry-After": "120"}, huge))
    http_server.reply("/streamed", Reply(429, stream_bytes=50 * 1024 * 1024))
    http_server.reply("/missing", Reply(404, body=huge))
    with pytest.raises(HttpRetryLater) as info:
        call(http_server.url("/declared"))
    assert (info.value.status, info.value.source) == (503, "retry-after")  # not "too large"
    assert info.value.excerpt.startswith("busy busy")
    with pytest.raises(HttpRetryLater) as info:
        call(http_server.url("/streamed"))
    assert info.value.status == 429
    [streamed] = http_server.requests("/streamed")
    assert streamed.bytes_sent < 32 * 1024 * 1024  # an excerpt's worth read, then we hung up
    with pytest.raises(HttpStatusError) as info:
        call(http_server.url("/missing"))
    assert info.value.status == 404
    assert not isinstance(info.value, ResponseTooLarge)
    # A status the caller accepts wants its body: there the limit applies.
    with pytest.raises(ResponseTooLarge):
        call(http_server.url("/missing"), accept=(404,))


def test_gzip__a_corrupt_or_truncated_body_is_undecodable_not_a_retry(http_server, provider):
    provider()
    gzipped = {"Content-Encoding": "gzip"}
    whole = gzip.compress(b"x" * 5000)
    http_server.reply("/corrupt", Reply(200, gzipped, whole[:10] + b"\xff" * 40))
    http_server.reply("/truncated", Reply(200, gzipped, whole[: len(whole) // 2]))
    for path in ("/corrupt", "/truncated"):
        with pytest.raises(UndecodableBody, match="undecodable response body") as info:
            call(http_server.url(path))
        assert isinstance(info.value, NonRetryable)
        assert info.value.status == 200
    # An error status is still classified by its status, whatever its body.
    http_server.reply("/busy", Reply(503, gzipped, b"\x1f\x8b garbage"))
    with pytest.raises(HttpRetryLater):
        call(http_server.url("/busy"))
    http_server.reply("/empty", Reply(204, gzipped, b""))  # nothing to decode is fine
    assert call(http_server.url("/empty")).status == 204


def test_pool_wait__is_cut_to_what_is_left_of_the_deadline(provider, make_client):
    provider(follow_redirects=True, total_timeout=2)
    seen: list[dict] = []

    class Body(httpx.SyncByteStream):  # a stream, as a network transport returns
        def __iter__(self):
            yield b"ok"

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(dict(request.extensions["timeout"]))
        if request.url.path == "/first":
            time.sleep(0.4)
            return httpx.Response(302, headers={"Location": "/second"}, stream=Body())
        return httpx.Response(200, stream=Body())

    client = make_client(transport=httpx.MockTransport(answer))
    assert client.request("GET", "http://api.test/first").status == 200
    first, second = seen
    assert first["pool"] <= 2
    # The second hop waits for a pooled connection at most for what is left of 2 s.
    assert second["pool"] <= 2 - 0.4
    assert all(value <= 2 - 0.4 for value in second.values())


def test_logs__httpx_never_logs_the_url_and_its_query(http_server, provider, caplog):
    caplog.set_level(logging.DEBUG)  # even with everything else at DEBUG
    provider()
    call(http_server.url("/x?token=q-secret-4242"))
    assert "q-secret-4242" not in caplog.text
    assert logging.getLogger("httpx").getEffectiveLevel() == logging.WARNING


# --- SSRF guard ------------------------------------------------------------------------------


@pytest.fixture
def refusals():
    seen: list[dict] = []

    def receiver(sender, **kwargs):
        seen.append(kwargs)

    signals.security_refusal.connect(receiver)
    yield seen
    signals.security_refusal.disconnect(receiver)


@pytest.mark.parametrize(
    ("host", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("[::1]", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.0.1", "private"),
        ("192.168.0.1", "private"),
        ("100.64.0.1", "private"),
        ("169.254.169.254", "link-local"),  # cloud metadata
        ("[fe80::1]", "link-local"),
        ("[fd00::1]", "unique-local"),
        ("224.0.0.1", "multicast"),
        ("[ff02::1]", "multicast"),
        ("240.0.0.1", "reserved"),
        ("0.0.0.0", "unspecified"),  # noqa: S104 - an address we refuse, not one we bind
        ("[::]", "unspecified"),
        ("[::ffff:127.0.0.1]", "loopback"),  # IPv4-mapped
        ("[::ffff:169.254.169.254]", "link-local"),
        ("[64:ff9b::a9fe:a9fe]", "link-local"),  # NAT64 of the metadata address
        ("[64:ff9b::a00:1]", "private"),
    ],
)
def test_ssrf__refuses_every_address_class_without_connecting(
    http_server, provider, refusals, host, kind
):
    provider(allow_hosts=[])
    with pytest.raises(SsrfRefused) as info:
        call(f"http://{host}:{http_server.port}/x")
    assert isinstance(info.value, NonRetryable)
    assert info.value.address_class == kind
    assert http_server.requests() == []
    [event] = refusals
    assert (event["category"], event["key"], event["cwe"]) == ("ssrf", f"ssrf-{kind}", "CWE-918")
    assert event["severity"] == "warning"


def test_ssrf__a_hostname_resolving_to_loopback_is_refused_unless_allow_listed(
    http_server, provider, refusals
):
    provider(allow_hosts=["127.0.0.1"])  # the address is allowed, the name is not
    with pytest.raises(SsrfRefused, match=r"localhost .*loopback"):
        call(http_server.url("/x", host="localhost"))
    assert http_server.requests() == []
    assert refusals[0]["key"] == "ssrf-loopback"
    assert call(http_server.url("/x")).status == 200  # the allow-listed literal works


def test_ssrf__security_keys_stay_a_small_fixed_set(http_server, provider, refusals):
    provider(allow_hosts=[])
    for host in ("10.0.0.1", "10.0.0.2", "10.9.9.9", "192.168.7.7", "[fd00::7]", "127.0.0.2"):
        with pytest.raises(SsrfRefused):
            call(f"http://{host}:{http_server.port}/?user=u{host}")
    keys = {event["key"] for event in refusals}
    assert keys <= {f"ssrf-{kind}" for kind in KINDS}
    assert len(keys) == 3  # per kind of problem, never per address or requester


def test_ssrf__connects_to_the_checked_address_with_one_lookup_and_keeps_the_host(
    http_server, provider, make_client
):
    provider(allow_hosts=["api.test"])
    lookups: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        lookups.append(host)
        return ["127.0.0.1"]

    client = make_client(resolver=resolver)
    response = client.request("GET", f"http://api.test:{http_server.port}/via-name")
    assert response.status == 200
    assert lookups == ["api.test"]  # one lookup; the connection used its answer
    [seen] = http_server.requests("/via-name")
    assert seen.header("Host") == f"api.test:{http_server.port}"


def test_ssrf__one_private_answer_among_public_ones_refuses_the_host(provider, make_client):
    provider(allow_hosts=[])
    client = make_client(resolver=lambda host, port: ["93.184.216.34", "127.0.0.1"])
    with pytest.raises(SsrfRefused, match=r"rebind\.test .*127\.0\.0\.1"):
        client.request("GET", "http://rebind.test/")


def test_tls__sni_and_certificate_use_the_name_while_connecting_to_the_checked_address(
    provider, make_client, tmp_path
):
    context, ca = make_tls("api.test", tmp_path)
    server = HttpServer(tls=context)
    try:
        provider(allow_hosts=["api.test", "wrong.test"], verify=ca)
        client = make_client(resolver=lambda host, port: ["127.0.0.1"])
        response = client.request("GET", f"https://api.test:{server.port}/secure")
        assert response.status == 200
        [seen] = server.requests("/secure")
        assert seen.sni == "api.test"
        assert seen.header("Host") == f"api.test:{server.port}"
        # Same address, another name: the certificate does not match, and that is a verdict.
        with pytest.raises(TransportFailed, match="TLS certificate verification failed"):
            client.request("GET", f"https://wrong.test:{server.port}/secure")
    finally:
        server.close()


def test_redirect__not_followed_by_default(http_server, provider):
    provider()
    target = http_server.url("/private", host="localhost")
    http_server.reply("/start", Reply(302, {"Location": target}))
    with pytest.raises(RedirectNotFollowed, match="302"):
        call(http_server.url("/start"))
    assert http_server.requests("/private") == []


def test_redirect__every_hop_is_checked_when_following(http_server, provider, refusals):
    provider(follow_redirects=True)
    http_server.reply("/to-private", Reply(302, {"Location": http_server.url("/p", "localhost")}))
    with pytest.raises(SsrfRefused):
        call(http_server.url("/to-private"))
    assert http_server.requests("/p") == []
    assert refusals[0]["key"] == "ssrf-loopback"
    http_server.reply("/to-meta", Reply(307, {"Location": "http://169.254.169.254/latest"}))
    with pytest.raises(SsrfRefused, match="link-local"):
        call(http_server.url("/to-meta"))
    http_server.reply("/to-ok", Reply(302, {"Location": http_server.url("/ok")}))
    http_server.reply("/ok", Reply(200, body=b"arrived"))
    assert call(http_server.url("/to-ok")).content == b"arrived"


def test_redirect__credentials_never_follow_to_another_origin(http_server, provider):
    other = HttpServer()  # another port: another origin
    try:
        provider(
            follow_redirects=True,
            auth_header="X-Partner",  # not named like a credential: dropped as the auth header
            headers={"X-Auth-Token": "static-token-5678"},
        )
        key, signing = "partner-key-1234", "whsec-signing-9876"
        http_server.reply("/start", Reply(302, {"Location": http_server.url("/again")}))
        http_server.reply("/again", Reply(307, {"Location": other.url("/land")}))
        call(
            http_server.url("/start"),
            method="POST",
            content=b"{}",
            headers={
                "X-Partner": key,
                "Authorization": f"Bearer {key}",
                "X-Signature": f"t=1,v1={signing}",
                "X-Tenant": f"acme {signing}",  # an innocent name carrying a secret
                "Idempotency-Key": "idem-1",
            },
            secrets={key, signing},
        )
        [same] = http_server.requests("/again")
        assert same.header("X-Partner") == key  # the same origin keeps what it was sent
        [landed] = other.requests("/land")
        for name in ("X-Partner", "Authorization", "X-Signature", "X-Tenant", "X-Auth-Token"):
            assert landed.header(name) is None, name
        assert not leaked(key, *landed.headers.values())
        assert not leaked(signing, *landed.headers.values())
        assert landed.header("Idempotency-Key") == "idem-1"
    finally:
        other.close()


def test_redirect__an_invalid_location_is_a_redirect_not_a_protocol_error(http_server, provider):
    provider()
    provider("following", follow_redirects=True)
    http_server.reply("/bad", Reply(302, {"Location": "http://[::1"}))
    with pytest.raises(RedirectNotFollowed, match="not followed for this provider"):
        call(http_server.url("/bad"))
    with pytest.raises(RedirectNotFollowed, match="Location header is not a valid URL"):
        call(http_server.url("/bad"), "following")


def test_not_modified__is_no_redirect_and_is_returned_when_accepted(http_server, provider):
    provider(follow_redirects=True)
    http_server.reply("/etag", Reply(304, {"ETag": '"v1"'}, b""))
    with pytest.raises(HttpStatusError, match="304: not modified") as info:
        call(http_server.url("/etag"))
    assert not isinstance(info.value, RedirectNotFollowed)
    assert call(http_server.url("/etag"), accept=(304,)).status == 304


# --- secrets ----------------------------------------------------------------------------------


def test_errors__redact_secrets_echoed_in_the_body(http_server, provider):
    provider()

    def echo(record):
        return Reply(400, body=f"bad auth {record.header('Authorization')} ".encode() * 50)

    http_server.reply("/echo", echo)
    token = "tok-5ecret-value-123"
    with pytest.raises(HttpStatusError) as info:
        call(
            http_server.url("/echo"),
            headers={"Authorization": f"Bearer {token}"},
            secrets={token},
        )
    assert token not in str(info.value)
    assert "[redacted]" in str(info.value)


def test_errors__no_piece_of_a_long_token_echoed_in_an_error_survives(http_server, provider):
    provider()

    def echo(record):
        return Reply(401, body=f"denied: {record.header('Authorization')} (expired)".encode())

    http_server.reply("/echo", echo)
    with pytest.raises(HttpStatusError) as info:
        call(
            http_server.url("/echo"),
            headers={"Authorization": f"Bearer {LONG_TOKEN}"},
            secrets={LONG_TOKEN},
        )
    assert "[redacted]" in str(info.value)
    assert not leaked(LONG_TOKEN, str(info.value), info.value.excerpt)


def test_errors__a_token_cut_off_by_the_partial_read_is_dropped(http_server, provider):
    provider()
    # Spaces collapse to one, so the token's first characters would open the excerpt;
    # the partial read (16 KiB of an error body) ends in the middle of the token.
    body = b" " * (http_client.PARTIAL_BODY_BYTES - 200) + LONG_TOKEN.encode()
    http_server.reply("/echo", Reply(503, body=body))
    with pytest.raises(HttpRetryLater) as info:
        call(http_server.url("/echo"), secrets={LONG_TOKEN})
    assert not leaked(LONG_TOKEN, str(info.value), info.value.excerpt)


def test_errors__a_header_h11_refuses_is_not_quoted_in_the_traceback(http_server, provider):
    provider()
    value = "Bearer tok-ctrl-char-secret\n"  # what a credential with a newline used to send
    with pytest.raises(TransportFailed, match="invalid request") as info:
        call(http_server.url("/x"), headers={"Authorization": value})
    assert http_server.requests() == []
    stored = error_entry(info.value, attempt=1, retryable=False, now=timezone.now())
    shown = "".join(traceback.format_exception(info.value))
    assert "tok-ctrl-char-secret" not in shown
    assert "tok-ctrl-char-secret" not in str(stored)


@pytest.mark.parametrize("url", ["http://[::1", "ftp://files.example.com/x", "mailto:a@b.c"])
def test_invalid_url__is_a_verdict_not_a_retry(provider, url):
    provider()
    with pytest.raises(TransportFailed, match="invalid URL"):
        call(url)
