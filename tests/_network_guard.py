"""Keeps the test process off the network: reaching anything but this machine fails the test.

tests/conftest.py installs one :class:`NetworkGuard` for the whole session. It wraps the
Python-level socket entry points that every connect in this process goes through, sync or
asyncio: ``socket.socket.connect``/``connect_ex`` (``socket.create_connection``, httpx,
``loop.sock_connect`` and ``loop.create_connection`` on the selector loop, anyio), UDP's
``sendto``/``sendmsg``, and the name lookups ``getaddrinfo``/``gethostbyname`` (so a
remote name is refused before a DNS query leaves). The check runs before the real call,
so a refused connect sends nothing.

Allowed: 127.0.0.0/8, ::1 (and IPv4-mapped loopback), the unspecified addresses (the
kernel routes them to this host), ``localhost`` names, this host's own name for lookups,
and every non-IP family (AF_UNIX, netlink). Processes the tests start are not covered:
the guard lives in this interpreter, and those servers are told to bind 127.0.0.1.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from typing import Any

import pytest

__all__ = ["NetworkGuard", "is_local_host"]

_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
_IP_FAMILIES = (socket.AF_INET, socket.AF_INET6)


def is_local_host(host: object) -> bool:
    """Whether ``host`` (a name or a literal address) can only mean this machine."""
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str):
        return False
    name = host.strip("[]").split("%", 1)[0].rstrip(".").lower()  # drop an IPv6 scope id
    if not name or name in _LOCAL_NAMES or name.endswith(".localhost"):  # "": the wildcard
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified


def _is_literal_address(host: object) -> bool:
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str):
        return False
    try:
        ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    return True


class NetworkGuard:
    """Wraps the socket entry points; records and refuses every non-loopback destination.

    A refusal raises pytest's failure exception (a ``BaseException``, so library code that
    catches ``OSError`` or ``Exception`` to retry or fall back does not hide it) and is kept
    in :attr:`violations`, which the per-test fixture checks at teardown too.
    """

    def __init__(self) -> None:
        self.violations: list[str] = []
        self.originals: dict[str, Callable[..., Any]] = {}
        self._hostname = socket.gethostname().lower()

    def install(self) -> None:
        """Patch the socket module (once; :meth:`uninstall` restores it)."""
        if self.originals:
            return
        guard = self
        self.originals = {
            "connect": socket.socket.connect,
            "connect_ex": socket.socket.connect_ex,
            "sendto": socket.socket.sendto,
            "sendmsg": socket.socket.sendmsg,
            "getaddrinfo": socket.getaddrinfo,
            "gethostbyname": socket.gethostbyname,
            "gethostbyname_ex": socket.gethostbyname_ex,
        }

        def connect(sock: socket.socket, address: Any) -> None:
            guard._check(sock.family, address, "connect to")
            guard.originals["connect"](sock, address)

        def connect_ex(sock: socket.socket, address: Any) -> int:
            guard._check(sock.family, address, "connect to")
            result: int = guard.originals["connect_ex"](sock, address)
            return result

        def sendto(sock: socket.socket, *args: Any) -> int:
            guard._check(sock.family, args[-1], "send a datagram to")
            sent: int = guard.originals["sendto"](sock, *args)
            return sent

        def sendmsg(sock: socket.socket, *args: Any, **kwargs: Any) -> int:
            address = kwargs.get("address", args[3] if len(args) > 3 else None)
            if address is not None:
                guard._check(sock.family, address, "send a datagram to")
            sent: int = guard.originals["sendmsg"](sock, *args, **kwargs)
            return sent

        def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
            guard._check_lookup(host)
            return guard.originals["getaddrinfo"](host, *args, **kwargs)

        def gethostbyname(host: str) -> str:
            guard._check_lookup(host)
            address: str = guard.originals["gethostbyname"](host)
            return address

        def gethostbyname_ex(host: str) -> Any:
            guard._check_lookup(host)
            return guard.originals["gethostbyname_ex"](host)

        socket.socket.connect = connect  # type: ignore[method-assign, assignment]
        socket.socket.connect_ex = connect_ex  # type: ignore[method-assign, assignment]
        socket.socket.sendto = sendto  # type: ignore[method-assign, assignment]
        socket.socket.sendmsg = sendmsg  # type: ignore[method-assign, assignment]
        socket.getaddrinfo = getaddrinfo
        socket.gethostbyname = gethostbyname
        socket.gethostbyname_ex = gethostbyname_ex

    def uninstall(self) -> None:
        """Put the original socket functions back."""
        originals, self.originals = self.originals, {}
        for name in ("connect", "connect_ex", "sendto", "sendmsg"):
            if name in originals:
                setattr(socket.socket, name, originals[name])
        for name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex"):
            if name in originals:
                setattr(socket, name, originals[name])

    def _refuse(self, what: str) -> None:
        message = (
            f"network guard: the test tried to {what}; tests may only reach this machine "
            "(127.0.0.0/8, ::1, localhost, AF_UNIX). Use a mock transport or a local server."
        )
        self.violations.append(message)
        pytest.fail(message, pytrace=True)

    def _check(self, family: int, address: Any, verb: str) -> None:
        if family not in _IP_FAMILIES:
            return
        host = address[0] if isinstance(address, tuple) and address else address
        if not is_local_host(host):
            self._refuse(f"{verb} {address!r}")

    def _check_lookup(self, host: Any) -> None:
        if host is None or _is_literal_address(host) or is_local_host(host):
            return  # a literal address needs no DNS; the connect is checked on its own
        name = host.decode("ascii", "replace") if isinstance(host, bytes) else str(host)
        if name.rstrip(".").lower() == self._hostname:
            return  # this host's own name (libraries look it up; /etc/hosts answers)
        self._refuse(f"look up the name {name!r}")
