"""The session's network guard: anything past loopback fails at once and sends nothing."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests._network_guard import NetworkGuard, is_local_host

REMOTE_V4 = ("10.255.255.1", 9)  # unroutable here: a real connect would hang, not refuse
DOCUMENTATION_V4 = ("192.0.2.1", 9)  # TEST-NET-1
DOCUMENTATION_V6 = ("2001:db8::1", 9, 0, 0)
Refused = pytest.fail.Exception


@pytest.fixture
def real_calls(network_guard: NetworkGuard) -> Iterator[list[tuple[str, Any]]]:
    """Replaces the real connect/lookup behind the guard with a recorder, so the test can tell
    whether a call got past the guard; the guard's refusals are consumed afterwards."""
    calls: list[tuple[str, Any]] = []
    saved = dict(network_guard.originals)

    def recorder(name: str) -> Any:
        def record(*args: Any, **kwargs: Any) -> Any:
            calls.append((name, args[1] if name.startswith(("connect", "send")) else args[0]))
            return saved[name](*args, **kwargs)

        return record

    network_guard.originals.update({name: recorder(name) for name in saved})
    try:
        yield calls
    finally:
        network_guard.originals.update(saved)
        network_guard.violations.clear()


@pytest.mark.parametrize("address", [REMOTE_V4, DOCUMENTATION_V4], ids=["10.x", "192.0.2.x"])
def test_a_sync_connect_to_a_remote_address_fails_before_any_packet(
    real_calls: list[tuple[str, Any]], address: tuple[str, int]
) -> None:
    began = time.monotonic()
    with pytest.raises(Refused, match=r"network guard: the test tried to connect to"):
        socket.create_connection(address, timeout=30)
    assert time.monotonic() - began < 10  # refused, not a 30 s connect timeout
    assert [name for name, _ in real_calls if name.startswith("connect")] == []
    with socket.socket() as sock, pytest.raises(Refused):
        sock.connect_ex(address)
    assert not any(name.startswith("connect") for name, _ in real_calls)


def test_ipv6_and_udp_and_remote_names_are_refused(real_calls: list[tuple[str, Any]]) -> None:
    if socket.has_ipv6:
        with socket.socket(socket.AF_INET6) as sock, pytest.raises(Refused, match="2001:db8"):
            sock.connect(DOCUMENTATION_V6)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        with pytest.raises(Refused, match="send a datagram"):
            udp.sendto(b"x", DOCUMENTATION_V4)
        with pytest.raises(Refused):
            udp.connect(DOCUMENTATION_V4)
    with pytest.raises(Refused, match=r"look up the name 'example\.com'"):
        socket.getaddrinfo("example.com", 443)
    with pytest.raises(Refused, match="look up the name"):
        socket.create_connection(("example.com", 80), timeout=30)
    assert real_calls == []


async def test_asyncio_connects_are_refused(real_calls: list[tuple[str, Any]]) -> None:
    loop = asyncio.get_running_loop()
    with pytest.raises(Refused, match=r"10\.255\.255\.1"):
        await asyncio.wait_for(asyncio.open_connection(*REMOTE_V4), 30)
    with socket.socket() as sock:
        sock.setblocking(False)
        with pytest.raises(Refused, match=r"192\.0\.2\.1"):
            await loop.sock_connect(sock, DOCUMENTATION_V4)
    with pytest.raises(Refused, match=r"example\.com"):
        await loop.getaddrinfo("example.com", 80)
    assert not any(name.startswith("connect") for name, _ in real_calls)


def test_the_teardown_check_sees_a_refusal_the_code_swallowed(
    network_guard: NetworkGuard, real_calls: list[tuple[str, Any]]
) -> None:
    try:
        socket.create_connection(DOCUMENTATION_V4, timeout=30)
    except BaseException:  # what a careless library might do
        pass
    assert len(network_guard.violations) == 1  # the per-test fixture would fail on this
    assert "192.0.2.1" in network_guard.violations[0]


def test_loopback_still_works_sync_and_asyncio(real_calls: list[tuple[str, Any]]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            peer, _ = server.accept()
            client.sendall(b"ping")
            assert peer.recv(4) == b"ping"
            peer.close()
        with socket.create_connection(("localhost", port), timeout=10):
            server.accept()[0].close()

        async def talk() -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            peer, _ = server.accept()
            peer.sendall(b"pong")
            data = await reader.readexactly(4)
            writer.close()
            await writer.wait_closed()
            peer.close()
            return data

        assert asyncio.run(talk()) == b"pong"
    assert ("connect", ("127.0.0.1", port)) in real_calls


def test_unix_sockets_are_allowed(tmp_path: Any, real_calls: list[tuple[str, Any]]) -> None:
    path = str(tmp_path / "s")
    with socket.socket(socket.AF_UNIX) as server, socket.socket(socket.AF_UNIX) as client:
        server.bind(path)
        server.listen()
        client.connect(path)
    assert ("connect", path) in real_calls


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("127.0.0.1", True),
        ("127.5.6.7", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", True),
        ("localhost", True),
        ("LOCALHOST.", True),
        ("api.localhost", True),
        ("", True),
        ("10.255.255.1", False),
        ("192.0.2.1", False),
        ("2001:db8::1", False),
        ("::ffff:192.0.2.1", False),
        ("example.com", False),
        ("localhost.example.com", False),
        (None, False),
    ],
)
def test_what_counts_as_this_machine(host: object, local: bool) -> None:
    assert is_local_host(host) is local
