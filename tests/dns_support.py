"""A resolver the tests choose the answers of: socket.getaddrinfo, which the webhook sender's
look-up threads call (pyworker/worker/webhook_transport.py), answering the names given with the
addresses given and every other name (the database's host among them) as it would."""

from __future__ import annotations

import socket
from typing import Any

import pytest


def fake_dns(monkeypatch: pytest.MonkeyPatch, answers: dict[str, list[str]]) -> None:
    """Each name of `answers` resolves to its addresses, in their order (IPv6 ones as AF_INET6)."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        name = host.decode() if isinstance(host, bytes) else host
        if name in answers:
            return [
                (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
                for a in answers[name]
            ]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
