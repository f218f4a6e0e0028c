"""Calls an engine client makes to every server at once, or to one by URL: health, server
info, which kind of server answers; and the servers no call may reach any more.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import anyio
import httpx

from .._exceptions import EngineError, EngineRequestRejected, EngineUnavailable, UserError
from . import _wire
from ._control import EngineServersFailed
from ._transport import _Transport

__all__ = ["ServerCalls"]

logger = logging.getLogger("toolrollout.engines")

T = TypeVar("T")


class ServerCalls(_Transport):
    """Control calls over the client's servers (a mixin of
    :class:`~toolrollout.engines._http_client.HTTPClient`, which sets ``_dead``)."""

    _dead: dict[str, str]
    """Servers no call may reach any more, with the reason (see :meth:`_mark_dead`)."""

    async def wait_healthy(
        self,
        timeout: float = 300.0,  # noqa: ASYNC109 - one deadline shared by all servers' polls
        *,
        interval: float = 1.0,
        path: str = "/health",
    ) -> None:
        """Poll ``GET /health`` on every server until all answer 200.

        Raises :class:`EngineUnavailable`, naming the servers that are not healthy and why,
        when ``timeout`` seconds pass.
        """
        self._check_open()
        pending = dict.fromkeys(self._router.urls, "not probed yet")
        deadline = anyio.current_time() + timeout

        async def probe(url: str) -> None:
            remaining = max(deadline - anyio.current_time(), 0.001)
            try:
                response = await self._http.get(url + path, timeout=remaining)
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                pending[url] = f"{type(exc).__name__}: {exc}".rstrip(": ")
                return
            if response.status_code == 200:
                pending.pop(url, None)
            else:
                pending[url] = f"HTTP {response.status_code}"

        with anyio.move_on_after(timeout):
            while pending:
                async with anyio.create_task_group() as group:
                    for url in list(pending):
                        group.start_soon(probe, url)
                if pending:
                    await anyio.sleep(interval)
        if pending:
            reasons = "; ".join(f"{url} ({why})" for url, why in pending.items())
            raise EngineUnavailable(f"{self._ENGINE} not healthy after {timeout:g} s: {reasons}")

    async def _on_every_server(
        self, method: str, path: str, body: Any
    ) -> dict[str, httpx.Response]:
        """One control call on all servers at once; failures are raised after all answered."""

        return await self._gather(path, lambda url: self._call(url, method, path, body))

    async def _gather(self, what: str, call: Callable[[str], Awaitable[T]]) -> dict[str, T]:
        """``call`` on every server at once, by URL; several failures raise
        :class:`EngineServersFailed`."""
        self._check_open()
        results: dict[str, T] = {}
        errors: dict[str, EngineError] = {}

        async def one(url: str) -> None:
            try:
                if url in self._dead:
                    raise EngineUnavailable(self._dead[url])
                results[url] = await call(url)
            except EngineError as exc:
                errors[url] = exc

        async with anyio.create_task_group() as tg:
            for url in self._router.urls:
                tg.start_soon(one, url)
        if len(errors) == 1:
            raise next(iter(errors.values()))
        if errors:
            ordered = {url: errors[url] for url in self._router.urls if url in errors}
            raise EngineServersFailed(what, ordered)
        return results

    def _resolve(self, url: str | None) -> str:
        if url is None:
            return self._router.urls[0]
        normalized = url.strip().rstrip("/")
        if normalized not in self._router.urls:
            raise UserError(f"{url!r} is not one of this client's servers {self._router.urls}")
        return normalized

    async def _get_info(self, url: str | None, paths: Sequence[str]) -> dict[str, Any]:
        self._check_open()
        target = self._resolve(url)
        for i, path in enumerate(paths):
            try:
                response = await self._call(target, "GET", path)
            except EngineRequestRejected as exc:
                if exc.status_code == 404 and i + 1 < len(paths):
                    continue  # an older server: try the legacy path
                raise
            data = _wire.parse_json(response.content, what=f"GET {target}{path}")
            if not isinstance(data, dict):
                raise EngineError(f"GET {target}{path}: expected a JSON object, got {data!r}")
            return data
        raise AssertionError("unreachable: the last path either returns or raises")

    async def server_kind(self, url: str) -> str:
        """``"vllm"`` or ``"sglang"``: who answers at ``url`` (anything not vLLM speaks
        SGLang's API)."""
        for path in ("/v1/models", "/server_info"):
            try:
                data = await self._get_info(url, (path,))
            except EngineRequestRejected:
                continue
            cards = data.get("data")
            if isinstance(cards, list) and any(
                isinstance(card, dict) and card.get("owned_by") == "vllm" for card in cards
            ):
                return "vllm"
            if "vllm_config" in data:
                return "vllm"
            if path == "/v1/models" and isinstance(cards, list):
                return "sglang"
        return "sglang"

    def _mark_dead(self, url: str, reason: str) -> None:
        """Send nothing more to ``url``: later calls to it raise :class:`EngineUnavailable`."""
        self._dead[url] = reason
        logger.error("%s: %s", type(self).__name__, reason)
