"""Which IP addresses count as public: the ones a user's webhook may reach.

One definition for both checks: `runrow serve`'s of a user's webhook_url when it takes the
request (pyworker/http/webhook_targets.py), and the webhook sender's of every address it is
about to connect to (pyworker/worker/webhook_transport.py), which is what a name rebound to a
private address between the two meets.
"""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# NAT64 prefixes whose addresses carry an IPv4 address in their last 32 bits: on an IPv6-only
# network with DNS64 every public IPv4 host resolves into one, so such an address is judged by
# the address it stands for, not refused whole as the reserved ::/8 it sits in. The well-known
# prefix (RFC 6052) and the local-use one (RFC 8215), of which a network takes a /96 as its own.
# Not covered, since nothing in an address says it is one: a network-specific prefix (an
# operator's 2001:db8:64::/96 is judged as the global IPv6 address it looks like), and a NAT64
# embedding the IPv4 at another RFC 6052 length (/48 to /64) inside 64:ff9b:1::/48, whose last
# 32 bits are not the IPv4 it reaches. Workers behind such a NAT64 need an egress policy.
NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))


def why_not_public(ip: IPAddress) -> str | None:
    """What makes `ip` an address a user's webhook must not reach, or None for a public one."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = embedded_ipv4(ip)
        if embedded is not None:
            return why_not_public(embedded)
        if ip.is_site_local:  # deprecated fec0::/10, still routed as private where it is used
            return "a private address"
    for kind, matches in (
        ("an unspecified address", ip.is_unspecified),
        ("a loopback address", ip.is_loopback),
        ("a link-local address (the cloud metadata service among them)", ip.is_link_local),
        ("a multicast address", ip.is_multicast),
        ("a private address", ip.is_private),
    ):
        if matches:
            return kind
    # Carrier-grade NAT (100.64/10), reserved and other special-purpose blocks: not the internet.
    if ip.is_reserved or not ip.is_global:
        return "not a public address"
    return None


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one is a way of reaching (mapped, 6to4, NAT64), if any: the
    IPv6 spelling of 127.0.0.1 must not pass for a public address."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if any(ip in prefix for prefix in NAT64):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None
