"""A resolver the tests choose the answers of: socket.getaddrinfo, which the webhook sender's
look-up threads and `runrow serve`'s webhook_url check call (pyworker/worker/webhook_transport.py,
pyworker/http/webhook_targets.py), answering the names given as the tests say and every other
name (the database's host among them) as it would."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import pytest

# A name's answer: its addresses, in their order (IPv6 ones as AF_INET6), or a function of the
# host returning getaddrinfo's tuples or raising as getaddrinfo would (NXDOMAIN, a hang).
Answer = list[str] | Callable[[str], list[Any]]


def fake_dns(monkeypatch: pytest.MonkeyPatch, answers: dict[str, Answer]) -> None:
    """Each name of `answers` resolves as its answer says. A numeric-only look-up
    (AI_NUMERICHOST, which asks whether the host spells an address) gets the real answer: no
    name does."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        name = host.decode() if isinstance(host, bytes) else str(host)
        flags = kwargs.get("flags", args[3] if len(args) > 3 else 0)
        answer = answers.get(name)
        if answer is None or flags & socket.AI_NUMERICHOST:
            return real(host, port, *args, **kwargs)
        if callable(answer):
            return answer(name)
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
            for a in answer
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
