"""Failed authentications by client address: past N a minute, the address gets 429s.

Every bad bearer token was answered 401 at full speed, so a client could try tokens as fast as
the service answers. A token bucket per address (capacity N, refilled at N a minute) is charged
one per request that fails to authenticate; an address whose bucket is empty gets a 429
`too_many_auth_failures` with Retry-After, however it authenticates, unless its token is of a
user who authenticated from that address before (below).

Why a correct token from a throttled address is not simply let through: then a guess that hits
answers 200 and one that misses answers 429 instead of 401, and guessing is exactly as fast as
without the limit. Why not refuse it outright either: clients behind one NAT, or one reverse
proxy, share an address, and one of them guessing (or holding a stale token) would lock out the
rest. So each address remembers the users that authenticated from it (MAX_USERS_PER_ADDRESS
of them, most recent kept); while it is throttled those users' tokens still pass, and any other
token, right or wrong, is a 429. A guesser learns nothing about a token not already in use from
its own address.

Process-local and bounded: at most MAX_ADDRESSES addresses are kept (least recently seen
evicted, so a spray of addresses costs memory up to that cap and no further), each a bucket
plus at most MAX_USERS_PER_ADDRESS user ids. IPv6 addresses count by their /64, the block one
host usually has.
The clock is time.monotonic(): this is request pacing within one process, not a lease.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_ADDRESSES = 10_000
MAX_USERS_PER_ADDRESS = 16
WINDOW_SECONDS = 60.0


@dataclass
class _Address:
    tokens: float
    updated: float
    users: OrderedDict[str, None] = field(default_factory=OrderedDict)


class AuthFailureLimiter:
    def __init__(
        self,
        per_minute: int,
        *,
        max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if per_minute < 1:
            raise ValueError("per_minute must be at least 1 (0 is no limiter at all)")
        self.capacity = float(per_minute)
        self.rate = per_minute / WINDOW_SECONDS  # tokens a second
        self.max_addresses = max_addresses
        self._clock = clock
        self._addresses: OrderedDict[str, _Address] = OrderedDict()

    def __len__(self) -> int:
        return len(self._addresses)

    def retry_after(self, address: str) -> int | None:
        """Seconds until `address` may fail once more, or None when it may now."""
        entry = self._refilled(address)
        if entry is None or entry.tokens >= 1:
            return None
        return max(1, math.ceil((1 - entry.tokens) / self.rate))

    def may_pass(self, address: str, user: str) -> bool:
        """Whether `user`, authenticated, passes a throttled `address`: one that authenticated
        from it before."""
        entry = self._addresses.get(address)
        return entry is not None and user in entry.users

    def failed(self, address: str) -> None:
        entry = self._refilled(address) or self._add(address)
        entry.tokens = max(0.0, entry.tokens - 1)

    def succeeded(self, address: str, user: str) -> None:
        entry = self._refilled(address) or self._add(address)
        entry.users[user] = None
        entry.users.move_to_end(user)
        while len(entry.users) > MAX_USERS_PER_ADDRESS:
            entry.users.popitem(last=False)

    def _refilled(self, address: str) -> _Address | None:
        entry = self._addresses.get(address)
        if entry is None:
            return None
        now = self._clock()
        entry.tokens = min(self.capacity, entry.tokens + (now - entry.updated) * self.rate)
        entry.updated = now
        self._addresses.move_to_end(address)
        return entry

    def _add(self, address: str) -> _Address:
        entry = _Address(self.capacity, self._clock())
        self._addresses[address] = entry
        while len(self._addresses) > self.max_addresses:
            self._addresses.popitem(last=False)
        return entry


def address_key(host: str | None) -> str:
    """The key an address is counted under: an IPv6 address by its /64 (one host's block, so
    rotating within it is not a fresh address), anything else as given."""
    if host is None:
        return "(unknown)"  # no client address (a Unix socket): one key for all of them
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)
