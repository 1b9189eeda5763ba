"""Which addresses an outbound request may reach: pure decisions for the SSRF guard (CWE-918).

The network backend resolves a host once, asks :func:`address_class` about
every address it got, and connects only to an address that passed — so a
DNS answer that changes between check and use (DNS rebinding) changes
nothing. Embedded IPv4 forms (IPv4-mapped ``::ffff:a.b.c.d``, NAT64
``64:ff9b::/96``, 6to4, IPv4-compatible ``::a.b.c.d``) are judged by the IPv4
address they carry, so ``[::ffff:127.0.0.1]`` is loopback, not "some IPv6".
The IPv4-translated form ``::ffff:0:a.b.c.d`` (SIIT) is never routed on the
internet: refused whatever it carries.

The checks are explicit rather than ``not ip.is_global``: Python's flags
differ between versions and get some ranges wrong for this purpose
(multicast counts as global; site-local ``fec0::/10`` and the local-use NAT64
prefix too).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Kinds of refused address; also the Security report's key (ssrf-<kind>): a short, fixed set.
UNSPECIFIED = "unspecified"
LOOPBACK = "loopback"
LINK_LOCAL = "link-local"  # includes 169.254.169.254, the cloud metadata service
PRIVATE = "private"
UNIQUE_LOCAL = "unique-local"
MULTICAST = "multicast"
RESERVED = "reserved"
KINDS = (UNSPECIFIED, LOOPBACK, LINK_LOCAL, PRIVATE, UNIQUE_LOCAL, MULTICAST, RESERVED)

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # RFC 2765 (SIIT)
# Python 3.11's tables predate these (is_global says True for both).
_V6_RESERVED = (
    ipaddress.ip_network("3fff::/20"),  # documentation (RFC 9637)
    ipaddress.ip_network("5f00::/16"),  # SRv6 segment identifiers (RFC 9602)
)
_V4_RESERVED = (ipaddress.ip_network("192.88.99.0/24"),)  # 6to4 relay anycast (RFC 7526)
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215: local-use translation
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_UNIQUE_LOCAL = ipaddress.ip_network("fc00::/7")
_SITE_LOCAL = ipaddress.ip_network("fec0::/10")
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT
_V4_LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
_V4_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
_RFC1918 = tuple(
    ipaddress.ip_network(net) for net in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
)


@dataclass(frozen=True)
class Refusal:
    kind: str  # one of KINDS
    form: str = ""  # "", "IPv4-mapped", "NAT64", "6to4", "IPv4-compatible", "IPv4-translated"

    def describe(self) -> str:
        return f"{self.kind} address" + (f" ({self.form} form)" if self.form else "")


def _embedded_ipv4(addr: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, str] | None:
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped, "IPv4-mapped"
    if addr in _NAT64:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF), "NAT64"
    if addr.sixtofour is not None:
        return addr.sixtofour, "6to4"
    if addr in _IPV4_COMPATIBLE and int(addr) > 1:  # not :: or ::1, judged as IPv6 below
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF), "IPv4-compatible"
    if addr in _IPV4_TRANSLATED:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF), "IPv4-translated"
    return None


def _ipv4_kind(addr: ipaddress.IPv4Address) -> str | None:
    if addr == ipaddress.IPv4Address(0) or addr in _V4_THIS_NETWORK:
        return UNSPECIFIED
    if addr in _V4_LOOPBACK:
        return LOOPBACK
    if addr.is_link_local:
        return LINK_LOCAL
    if addr.is_multicast:
        return MULTICAST
    if addr in _SHARED:
        return PRIVATE
    if addr.is_reserved or addr == ipaddress.IPv4Address("255.255.255.255"):
        return RESERVED
    if any(addr in net for net in _V4_RESERVED):
        return RESERVED
    if addr.is_private:
        # 10/8, 172.16/12, 192.168/16 — and the special-purpose blocks Python
        # also calls private (documentation, benchmarking…), which are as unroutable.
        return PRIVATE if any(addr in net for net in _RFC1918) else RESERVED
    if not addr.is_global:
        return RESERVED
    return None


def _ipv6_kind(addr: ipaddress.IPv6Address) -> str | None:
    if addr.is_unspecified:
        return UNSPECIFIED
    if addr.is_loopback:
        return LOOPBACK
    if addr.is_link_local:
        return LINK_LOCAL
    if addr.is_multicast:
        return MULTICAST
    if addr in _UNIQUE_LOCAL:
        return UNIQUE_LOCAL
    if addr in _SITE_LOCAL or addr in _NAT64_LOCAL:
        return PRIVATE
    if addr.is_reserved or any(addr in net for net in _V6_RESERVED):
        return RESERVED
    if addr.is_private or not addr.is_global:
        return RESERVED
    return None


def address_refusal(address: str | IPAddress) -> Refusal | None:
    """None if outbound requests may reach ``address``; else why not."""
    addr = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.scope_id:
            addr = ipaddress.IPv6Address(str(addr).split("%", 1)[0])
        embedded = _embedded_ipv4(addr)
        if embedded is not None:
            inner, form = embedded
            kind = _ipv4_kind(inner)
            if kind is None and form == "IPv4-translated":
                kind = RESERVED
            return Refusal(kind, form) if kind else None
        kind = _ipv6_kind(addr)
    else:
        kind = _ipv4_kind(addr)
    return Refusal(kind) if kind else None


def normalize_host(host: str) -> str:
    """Lower-case, without IPv6 brackets or a trailing dot; IP literals in canonical form."""
    text = host.strip().lower().removeprefix("[").removesuffix("]").rstrip(".")
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return text


def is_allowed_host(host: str, allow_hosts: Iterable[str]) -> bool:
    """Is ``host`` (as written in the URL) on the operator's allow-list?

    Entries are host names or IP literals compared exactly with the URL's host,
    not with what it resolves to: allowing ``127.0.0.1`` does not allow
    ``localhost``, and allowing ``hooks.internal`` trusts that name's DNS.
    """
    wanted = normalize_host(host)
    return any(wanted == normalize_host(entry) for entry in allow_hosts if entry.strip())
