"""An https delivery through the address the sender resolved itself is still TLS to the name.

ResolvingBackend looks the host up and opens the TCP connection to the address it found; the TLS
handshake above it must still send the webhook_url's host as SNI and verify the receiver's
certificate against that name, not against the IP connected to. Here a self-signed certificate
for NAME (made by openssl for the test, and the only one the client trusts) is served on
127.0.0.1, which NAME resolves to.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import certifi
import httpx
import pytest
from dns_support import fake_dns

from pyworker.worker.webhook_transport import sender_client

NAME = "hooks-tls.example"
OTHER = "other-tls.example"  # resolves to the same address; the certificate does not name it


@pytest.fixture
def certificate(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make the test's certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={NAME}",
         "-addext", f"subjectAltName=DNS:{NAME}"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    yield key, cert


async def test_an_https_delivery_sends_the_hosts_sni_and_verifies_its_certificate(
    certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    key, cert = certificate
    server_names: list[str | None] = []
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    server_ctx.sni_callback = lambda _sock, name, _ctx: server_names.append(name)  # type: ignore[assignment,misc]

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass  # a client that refused our certificate
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    fake_dns(monkeypatch, {NAME: ["127.0.0.1"], OTHER: ["127.0.0.1"]})
    # The only authority the client trusts: the test's certificate (httpx reads certifi's bundle
    # when the transport is built; the sender reads no SSL_CERT_FILE, trust_env is off).
    monkeypatch.setattr(certifi, "where", lambda: str(cert))
    try:
        async with sender_client(timeout=5.0, user_agent="test", proxy=None, allow_private=True) as client:
            response = await client.post(f"https://{NAME}:{port}/hooks", content=b"{}")
            assert response.status_code == 200
            assert server_names == [NAME], "SNI is the webhook_url's host, not the address connected to"
            # The same address under a name the certificate does not hold: refused, so the name
            # is what the certificate was checked against.
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await client.post(f"https://{OTHER}:{port}/hooks", content=b"{}")
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await client.post(f"https://127.0.0.1:{port}/hooks", content=b"{}")
    finally:
        server.close()
        await server.wait_closed()
