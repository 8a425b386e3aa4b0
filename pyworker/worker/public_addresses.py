"""Which IP addresses count as public, and which a webhook may reach: the public ones and
those in the networks the operator allowed (--webhook-allow-network).

One definition for both checks: `runrow serve`'s of a user's webhook_url when it takes the
request (pyworker/http/webhook_targets.py), and the webhook sender's of every address it is
about to connect to (pyworker/worker/webhook_transport.py), which is what a name rebound to a
private address between the two meets. Both take the same flags (pyworker/cli/
webhook_receivers.py) and judge through why_refused, so a receiver the workers would reach is
not refused at enqueue, nor one they would refuse taken.
"""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# NAT64 prefixes whose addresses carry an IPv4 address in their last 32 bits: on an IPv6-only
# network with DNS64 every public IPv4 host resolves into one, so such an address is judged by
# the address it stands for, not refused whole as the reserved ::/8 it sits in. The well-known
# prefix (RFC 6052), a /96; and the local-use one (RFC 8215), of which a network takes a prefix
# of its own, a /96 or one of RFC 6052's /48, /56, /64 layouts, which put the IPv4 address in
# bits 48-103 instead (64:ff9b:1:a9fe:a9:fe00:5db8:d822 is 169.254.169.254 in the /48 layout,
# 93.184.216.34 read as a /96). Only the /96 layout with bits 64-95 zero (the u-octet, which RFC
# 6052 keeps zero, and the rest before the last 32 bits) is judged by its last 32 bits; any
# other address of 64:ff9b:1::/48 is refused (a network's /96 must be 64:ff9b:1:x::/96).
# Not covered, since nothing in an address says it is one: a network-specific prefix (an
# operator's 2001:db8:64::/96 is judged as the global IPv6 address it looks like), and a NAT64
# using a shorter layout of the local-use prefix, whose addresses with bits 64-95 zero reach
# a.b.0.0 (/48) or a.0.0.0 (/56), not their last 32 bits. Workers behind one need an egress policy.
NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")
NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")
UNREADABLE_NAT64 = "a NAT64 address whose IPv4 address is not in its last 32 bits (64:ff9b:1::/48)"


def why_not_public(ip: IPAddress) -> str | None:
    """What makes `ip` an address a user's webhook must not reach, or None for a public one."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = embedded_ipv4(ip)
        if embedded is not None:
            return why_not_public(embedded)
        if ip in NAT64_LOCAL_USE:
            return UNREADABLE_NAT64
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


def why_refused(ip: IPAddress, allowed: tuple[IPNetwork, ...]) -> str | None:
    """Why a webhook must not reach `ip`, or None: it is public, or in an `allowed` network. An
    IPv6 spelling of an IPv4 address (mapped, 6to4, NAT64) is allowed when the address it reaches
    is in an allowed network, and only then: its IPv6 form is not matched, or listing
    ::ffff:0:0/96 or 2002::/16 would let through the spelling of every IPv4 address,
    169.254.169.254 included. One whose IPv4 address cannot be told (hides_ipv4) is in no
    allowed network."""
    reason = why_not_public(ip)
    if reason is None or not allowed or hides_ipv4(ip):
        return reason
    inside = embedded_ipv4(ip) if isinstance(ip, ipaddress.IPv6Address) else None
    judged = inside if inside is not None else ip
    if any(judged in network for network in allowed):
        return None
    return reason


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one is a way of reaching (mapped, 6to4, NAT64), if any: the
    IPv6 spelling of 127.0.0.1 must not pass for a public address."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in NAT64_WELL_KNOWN or (ip in NAT64_LOCAL_USE and (int(ip) >> 32) & 0xFFFFFFFF == 0):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def hides_ipv4(ip: IPAddress) -> bool:
    """`ip` reaches an IPv4 address, but one its bits do not tell (a local-use NAT64 address
    outside the /96 layout): no network, IPv4 or IPv6, can be said to hold what it reaches."""
    return isinstance(ip, ipaddress.IPv6Address) and ip in NAT64_LOCAL_USE and embedded_ipv4(ip) is None
