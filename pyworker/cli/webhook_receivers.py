"""Which receivers a webhook may reach: all of them (--allow-private-webhooks), or public addresses
and the networks listed (--webhook-allow-network). `runrow worker`'s sender checks them at
delivery, and `runrow serve` a user's webhook_url at enqueue: both commands take these options,
from this one definition, so the two cannot disagree on a value or its spelling. Both also come
from the environment, as the other webhook options do (a deployment that sets RUNROW_WEBHOOK_*
for its workers and service sets the networks the same way), except serve's
--allow-private-webhooks, which is a flag only (see add_arguments)."""

from __future__ import annotations

import argparse
import ipaddress
from collections.abc import Sequence
from typing import Any, Literal

from pyworker.cli.types import env_default
from pyworker.worker.public_addresses import NAT64_LOCAL_USE, NAT64_WELL_KNOWN, IPNetwork

Command = Literal["worker", "serve"]
ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")
# The shortest network --webhook-allow-network takes, by IP version: 0.0.0.0/0 or ::/0 is
# --allow-private-webhooks said otherwise (the metadata service included), and a /4 nearly so.
SHORTEST_PREFIX = {4: 8, 6: 16}


def on_off(text: str) -> bool:
    """An environment variable's value for a switch. Anything else is refused, not taken as off:
    RUNROW_ALLOW_PRIVATE_WEBHOOKS=enabled must not leave every private receiver refused unsaid."""
    if text.strip().lower() in ON:
        return True
    if text.strip().lower() in OFF:
        return False
    raise argparse.ArgumentTypeError(f"must be one of {', '.join(ON + OFF)}, got {text[:40]!r}")


def networks(text: str) -> list[IPNetwork]:
    """One or more networks in CIDR notation, comma-separated (an address alone is its /32 or
    /128). Host bits set are refused, naming the network meant: 10.1.2.3/8 is a typo as often as
    it is 10.0.0.0/8. So is a network shorter than SHORTEST_PREFIX: allowing every address is
    --allow-private-webhooks' job, said as such."""
    found: list[IPNetwork] = []
    for item in (part.strip() for part in text.split(",")):
        try:
            network = ipaddress.ip_network(item)
        except ValueError:
            try:
                meant = ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"must be a network in CIDR notation (10.0.0.0/8, fd00:1::/32), got {item[:60]!r}"
                ) from None
            raise argparse.ArgumentTypeError(f"{item} has host bits set: the network is {meant}") from None
        spelled = ipv4_spelling(network)
        if spelled is not None:
            raise argparse.ArgumentTypeError(
                f"{network} spells IPv4 addresses in IPv6 ({spelled}), which are allowed by the IPv4 "
                "network they reach, never by their IPv6 form: list the IPv4 network instead"
            )
        shortest = SHORTEST_PREFIX[network.version]
        if network.prefixlen < shortest:
            raise argparse.ArgumentTypeError(
                f"{network} is wider than a /{shortest}: to let deliveries reach every address, "
                "use --allow-private-webhooks (a worker also reads RUNROW_ALLOW_PRIVATE_WEBHOOKS=1; "
                "serve, the flag only)"
            )
        found.append(network)
    return found


# The IPv6 ranges that spell IPv4 addresses: public_addresses.why_refused judges an address in
# them by the IPv4 address it reaches, so a network listed inside them would match nothing.
IPV4_SPELLINGS = (
    (ipaddress.IPv6Network("::ffff:0:0/96"), "IPv4-mapped"),
    (ipaddress.IPv6Network("2002::/16"), "6to4"),
    (NAT64_WELL_KNOWN, "NAT64"),
    (NAT64_LOCAL_USE, "local-use NAT64"),
)


def ipv4_spelling(network: IPNetwork) -> str | None:
    """Which IPv4 spelling `network` lies within, if any. Accepted, it would fail safe (match
    nothing) and silently: the operator meant the IPv4 network, and should be told so."""
    if isinstance(network, ipaddress.IPv6Network):
        for spelling, name in IPV4_SPELLINGS:
            if network.subnet_of(spelling):
                return name
    return None


class _Switch(argparse.Action):
    """A switch (no value) whose default is an environment variable's on_off value, or off when
    it has no variable."""

    def __init__(self, option_strings: Sequence[str], dest: str, var: str | None, **kwargs: Any) -> None:
        default = None if var is None else env_default(var, empty_is_unset=True)
        super().__init__(option_strings, dest, nargs=0, default=default or False, type=on_off, **kwargs)

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option: Any = None) -> None:
        setattr(namespace, self.dest, True)


class _Networks(argparse.Action):
    """A repeatable list of networks. Given on the command line it replaces the environment's
    list rather than adding to it: a flag wins over its variable, as everywhere else."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option: Any = None) -> None:
        current = getattr(namespace, self.dest)
        setattr(namespace, self.dest, [*([] if current is self.default else current), *values])


# What both commands' help says of the addresses refused, and of the networks' rules.
NON_PUBLIC = (
    "loopback, private (10/8, 172.16/12, 192.168/16, fc00::/7), link-local (169.254/16, the "
    "cloud metadata service; fe80::/10), unspecified, multicast and other non-public addresses"
)
NETWORK_RULES = (
    "repeat it, or separate them with commas (env RUNROW_WEBHOOK_ALLOW_NETWORKS; given here, the "
    "flags replace its list rather than add to it). No wider than a /8 (IPv4) or /16 (IPv6): "
    "--allow-private-webhooks allows every address. An IPv6 spelling of an IPv4 address "
    "(::ffff:a.b.c.d, 6to4, NAT64) is allowed by the IPv4 network it reaches (a network inside "
    "those ranges is refused: list the IPv4 one). Every other non-public address stays refused"
)
# Each command's help: the flags are the same, what they change in it is not. `serve` checks a
# user's webhook_url when it takes the run, the workers every address at delivery; a fleet gives
# both the same values (RUNROW_WEBHOOK_ALLOW_NETWORKS reaches both; serve's allow-everything is
# its own flag), or one refuses what the other would allow.
HELP: dict[Command, tuple[str, str]] = {
    "worker": (
        f"let webhook deliveries reach {NON_PUBLIC}: every one, a user's name rebound to one "
        "included. Without it the sender checks every address it connects to and connects to "
        "public ones only (and --webhook-allow-network's): a user's name rebound to a private "
        "address after `runrow serve` checked it is not reached. For local development, or a fleet "
        "whose users cannot set webhook_url; prefer --webhook-allow-network for receivers of your "
        "own. Through --webhook-proxy, the proxy's policy decides (env RUNROW_ALLOW_PRIVATE_WEBHOOKS=1)",
        "a network webhook deliveries may reach though it is not public (10.96.0.0/12 for "
        "receivers on a Kubernetes service network, 172.17.0.0/16 on Docker's bridge); "
        f"{NETWORK_RULES}. The trade-off: a user who may set webhook_url may reach any receiver in "
        "these networks too (a name rebound to one of their addresses), so list only networks "
        "whose every listener may take such a POST; `runrow serve` takes the same flag, so that it "
        "accepts at enqueue what the workers reach; default none",
    ),
    "serve": (
        f"let a user's webhook_url (--user-may-set webhook_url) point at {NON_PUBLIC}, or a name "
        "that resolves to one; without it such a request is a 422, since the workers would POST "
        "into your own network for that user. For local development and receivers you run "
        "yourself; prefer --webhook-allow-network for receivers of your own. It does not reach "
        "the workers, which check every address again at delivery (DNS rebinding): give them the "
        "same flag (or their RUNROW_ALLOW_PRIVATE_WEBHOOKS=1). serve reads no variable for this "
        "one: opening every private address to users' URLs is said on serve's own command line, "
        "not inherited from an environment shared with the workers",
        "a network a user's webhook_url may point into though it is not public (10.96.0.0/12 for "
        "receivers on a Kubernetes service network, 172.17.0.0/16 on Docker's bridge): a host "
        "that is, or resolves only to, public addresses and addresses in these networks is "
        f"taken; {NETWORK_RULES} (a 422). Any user who may set webhook_url may aim at any "
        "listener in these networks, so list only networks whose every listener may take such a "
        "POST. Give the workers the same networks (the variable is theirs too): they check every "
        "address again at delivery, and deliver into a network only when it is theirs; default none",
    ),
}


def add_arguments(p: argparse.ArgumentParser, command: Command) -> None:
    """The two options, defined once for `runrow worker` and `runrow serve`: the same variables,
    the same validation and the same messages; only the help says what each command does."""
    private_help, networks_help = HELP[command]
    p.add_argument(
        "--allow-private-webhooks",
        action=_Switch,
        # serve's is said on its own command line, never inherited: a service started in its
        # workers' environment would otherwise let every user aim a webhook_url at loopback and
        # the metadata service (networks, narrow and listed, do come from the variable).
        var="RUNROW_ALLOW_PRIVATE_WEBHOOKS" if command == "worker" else None,
        help=private_help,
    )
    p.add_argument(
        "--webhook-allow-network",
        action=_Networks,
        type=networks,
        default=env_default("RUNROW_WEBHOOK_ALLOW_NETWORKS", empty_is_unset=True) or (),
        metavar="CIDR",
        help=networks_help,
    )


def allowed_networks(args: argparse.Namespace) -> tuple[IPNetwork, ...]:
    """The networks --webhook-allow-network (or its variable) listed, once each, in order."""
    return tuple(dict.fromkeys(args.webhook_allow_network))
