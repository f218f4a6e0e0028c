"""Choosing a server among several: sticky sessions, least outstanding requests, failover.

See docs/engines.md (sticky routing) and docs/fault-tolerance.md#failover. The router is
plain synchronous state on one event loop (not thread-safe).
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

__all__ = ["Router", "ServerStats"]

logger = logging.getLogger("toolrollout.engines.routing")


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
    down: bool = False
    """Whether failover considers it down right now (docs/fault-tolerance.md#failover)."""
    moved_away: int = 0
    """Sessions moved off it to a healthy server."""


@dataclass(slots=True)
class _Server:
    url: str
    outstanding: int = 0
    requests: int = 0
    failures: int = 0
    sessions: int = 0
    faults: int = 0
    """Server faults in a row (failover's count; a success resets it)."""
    down_until: float = -math.inf
    moved_away: int = 0


class Router:
    """Session -> server map (bounded LRU) plus per-server load counters."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        max_sessions: int,
        failover_after: int | None = None,
        cooldown: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not urls:
            raise ValueError("at least one server URL is required")
        if max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        if failover_after is not None and failover_after < 1:
            raise ValueError("failover_after must be at least 1 (or None to disable failover)")
        self._failover_after = failover_after
        self._cooldown = cooldown
        self._clock = clock
        self.moves = 0
        """Sessions moved to another server by failover."""
        self.outstanding = 0
        """Requests in flight over all servers (what the connection pool holds)."""
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

        A pinned session gets its server back unless it is down and another is up; ``avoid``
        steers only a new choice away from servers that just refused, unless none is left.
        """
        if session_id is not None:
            url = self._sessions.get(session_id)
            if url is not None:
                moved = self._fail_over(session_id, url)
                if moved is not None:
                    return moved
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
        self.outstanding += 1

    def release(self, url: str, *, failed: bool = False) -> None:
        """Count a request on ``url`` as done (``failed`` when it ended in an error)."""
        server = self._servers[url]
        server.outstanding -= 1
        self.outstanding -= 1
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
                down=self.is_down(s.url),
                moved_away=s.moved_away,
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
        candidates = self._up(candidates)
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

    # --- failover (docs/fault-tolerance.md#failover) ------------------------------------

    def note_fault(self, url: str) -> None:
        """An attempt on ``url`` failed for a server reason (connection, timeout, 5xx)."""
        server = self._servers[url]
        server.faults += 1
        if self._failover_after is None or server.faults < self._failover_after:
            return
        if not self.is_down(url):
            logger.warning(
                "%s failed %d times in a row: marked down for %g s; its sessions move to "
                "a healthy server",
                url,
                server.faults,
                self._cooldown,
            )
        server.down_until = self._clock() + self._cooldown

    def note_ok(self, url: str) -> None:
        """An attempt on ``url`` was answered (the server is up)."""
        server = self._servers[url]
        if server.faults >= (self._failover_after or math.inf):
            logger.info("%s answers again: back in rotation", url)
        server.faults = 0
        server.down_until = -math.inf

    def is_down(self, url: str) -> bool:
        """Whether ``url`` is down for failover right now (always False when disabled)."""
        server = self._servers[url]
        return (
            self._failover_after is not None
            and server.faults >= self._failover_after
            and self._clock() < server.down_until
        )

    def _up(self, candidates: list[str]) -> list[str]:
        """The candidates that are not down, or all of them when every one is."""
        if self._failover_after is None:
            return candidates
        return [url for url in candidates if not self.is_down(url)] or candidates

    def _fail_over(self, session_id: str, url: str) -> str | None:
        """Move a session off a down server; the new server, or None to stay."""
        if not self.is_down(url):
            return None
        others = [u for u in self._order if u != url and not self.is_down(u)]
        if not others:
            return None  # nowhere better: keep retrying the pinned server
        target = self._least_loaded(())
        del self._sessions[session_id]
        self._servers[url].sessions -= 1
        self._servers[url].moved_away += 1
        self.moves += 1
        self._bind(session_id, target)
        logger.info("session %s moved from %s to %s (failover)", session_id, url, target)
        return target
