"""Choosing a server among several: sticky sessions, least outstanding requests.

All turns of one trajectory go to the server that served its first turn, so that server's
radix (prefix) cache already holds the shared prompt. A new session goes to the server
with the fewest requests in flight from this client, then the fewest bound sessions; ties
are broken round-robin from a moving cursor, which is deterministic (no RNG) and still
spreads a sequential stream of new sessions over all servers.

The router is plain synchronous state: the client mutates it only between ``await``
points on one event loop, so it needs no lock (and is not thread-safe).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass

__all__ = ["Router", "ServerStats"]


@dataclass(frozen=True, slots=True)
class ServerStats:
    """A snapshot of one server's counters (see ``SGLangClient.stats``)."""

    url: str
    outstanding: int
    """Requests from this client in flight on the server right now."""
    requests: int
    """HTTP requests sent to it (each retry attempt counts)."""
    failures: int
    """Attempts on it that ended in an error (connection, timeout, HTTP error status)."""
    sessions: int
    """Sessions currently pinned to it."""


@dataclass(slots=True)
class _Server:
    url: str
    outstanding: int = 0
    requests: int = 0
    failures: int = 0
    sessions: int = 0


class Router:
    """Session -> server map (bounded LRU) plus per-server load counters."""

    def __init__(self, urls: Sequence[str], *, max_sessions: int) -> None:
        if not urls:
            raise ValueError("at least one server URL is required")
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        self._servers = {url: _Server(url) for url in urls}
        self._order = list(urls)
        self._cursor = 0
        self._max_sessions = max_sessions
        self._sessions: OrderedDict[str, str] = OrderedDict()

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(self._order)

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    def server_of(self, session_id: str) -> str | None:
        """The server a session is pinned to, without touching its LRU position."""
        return self._sessions.get(session_id)

    def pick(self, session_id: str | None, *, avoid: Collection[str] = ()) -> str:
        """Return the server for the next request of ``session_id`` and pin the session.

        A pinned session always gets its server back (``avoid`` is ignored: a sticky
        session is retried on the same server). ``avoid`` steers a new choice away from
        servers that just refused a connection, unless that would leave none.
        """
        if session_id is not None:
            url = self._sessions.get(session_id)
            if url is not None:
                self._sessions.move_to_end(session_id)
                return url
        url = self._least_loaded(avoid)
        if session_id is not None:
            self._bind(session_id, url)
        return url

    def bind(self, session_id: str, url: str) -> None:
        """Pin ``session_id`` to ``url`` unless it is pinned already (batch calls)."""
        if session_id in self._sessions:
            self._sessions.move_to_end(session_id)
        else:
            self._bind(session_id, url)

    def unbind(self, session_id: str) -> bool:
        """Forget a session's server; its next request picks a server afresh."""
        url = self._sessions.pop(session_id, None)
        if url is None:
            return False
        self._servers[url].sessions -= 1
        return True

    def acquire(self, url: str) -> None:
        """Count a request as in flight on ``url``."""
        server = self._servers[url]
        server.outstanding += 1
        server.requests += 1

    def release(self, url: str, *, failed: bool = False) -> None:
        """Count a request on ``url`` as done (``failed`` when it ended in an error)."""
        server = self._servers[url]
        server.outstanding -= 1
        if failed:
            server.failures += 1

    def stats(self) -> tuple[ServerStats, ...]:
        return tuple(
            ServerStats(
                url=s.url,
                outstanding=s.outstanding,
                requests=s.requests,
                failures=s.failures,
                sessions=s.sessions,
            )
            for s in (self._servers[url] for url in self._order)
        )

    def _bind(self, session_id: str, url: str) -> None:
        self._sessions[session_id] = url
        self._servers[url].sessions += 1
        while len(self._sessions) > self._max_sessions:
            _, evicted = self._sessions.popitem(last=False)
            self._servers[evicted].sessions -= 1

    def _least_loaded(self, avoid: Collection[str]) -> str:
        candidates = [url for url in self._order if url not in avoid] or self._order
        n = len(self._order)
        # Rotate so that ties go to the first candidate at or after the cursor.
        start = self._cursor % n
        rotated = sorted(
            candidates,
            key=lambda url: (
                self._servers[url].outstanding,
                self._servers[url].sessions,
                (self._order.index(url) - start) % n,
            ),
        )
        choice = rotated[0]
        self._cursor = self._order.index(choice) + 1
        return choice
