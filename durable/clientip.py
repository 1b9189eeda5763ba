"""Where a request came from, trusting ``X-Forwarded-For`` exactly as far as configured.

Shared by everything that names a request's client — the dashboard's audit
trail and Security tallies, the API's refusals — so they can never disagree.

Anyone can send an ``X-Forwarded-For`` header, so by default it is ignored and
the address is the TCP peer (``REMOTE_ADDR``). Behind N reverse proxies of
your own (``TRUSTED_PROXY_COUNT = N``) each proxy appends the address it saw,
so the client is the N-th entry from the right; entries further left were
written by the client and are not believed. Fewer entries than N means the
request did not come through all the proxies: the peer address is used.
"""

from __future__ import annotations

import ipaddress
import re

from django.conf import settings
from django.http import HttpRequest

MAX_HEADER_CHARS = 4096
# "203.0.113.9:51234" and "[2001:db8::1]:443": proxies sometimes add the port.
_V4_WITH_PORT = re.compile(r"^(\d{1,3}(?:\.\d{1,3}){3}):\d{1,5}$")
_V6_BRACKETED = re.compile(r"^\[([^\]]+)\](?::\d{1,5})?$")


def parse_address(value: object) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An IP address from text; IPv4-mapped IPv6 becomes IPv4, a zone id is dropped."""
    if not isinstance(value, str):
        return None
    text = value.strip().strip("[]")
    if not text or len(text) > 64:
        return None
    text = text.split("%", 1)[0]  # fe80::1%eth0: the zone means nothing to a reader elsewhere
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def parse_forwarded_entry(entry: str) -> str | None:
    """One ``X-Forwarded-For`` element as a normalised address, or None."""
    text = entry.strip().strip('"')
    if (match := _V4_WITH_PORT.match(text)) or (match := _V6_BRACKETED.match(text)):
        text = match.group(1)
    address = parse_address(text)
    return str(address) if address is not None else None


def client_ip(
    remote_addr: str | None, forwarded_for: str | None, trusted_proxies: int
) -> str | None:
    """The client's address (IPv4-mapped IPv6 as IPv4), or None when nothing usable is known."""
    peer = parse_forwarded_entry(remote_addr or "")
    if trusted_proxies <= 0 or not forwarded_for:
        return peer
    # Keep the right end: that is what our proxies wrote; the left is the client's.
    entries = [part for part in forwarded_for[-MAX_HEADER_CHARS:].split(",") if part.strip()]
    if len(entries) < trusted_proxies:
        return peer
    return parse_forwarded_entry(entries[-trusted_proxies]) or peer


def request_client_ip(request: HttpRequest) -> str | None:
    """``client_ip`` for a Django request, with the site's ``TRUSTED_PROXY_COUNT``."""
    return client_ip(
        request.META.get("REMOTE_ADDR"),
        request.META.get("HTTP_X_FORWARDED_FOR"),
        int(getattr(settings, "TRUSTED_PROXY_COUNT", 0)),
    )
