"""One place that turns "where is the model" into a running engine, and asks it about itself.

``connect`` is the engine factory every entry point shares: engine URLs give a
:class:`~toolrollout.engines.SGLangClient` (once its servers are healthy), a model folder
gives the embedded CPU engine. The small questions a run asks an engine (its context
length, aborting everything on shutdown) are functions here so that callers never probe
the two engine classes themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._base import Engine

__all__ = ["abort_all_requests", "connect", "discover_context_length"]


async def connect(
    engine_urls: Sequence[str] = (),
    model_path: str | Path | None = None,
    *,
    threads: int | None = None,
    health_timeout: float = 120.0,
    **client_options: Any,
) -> Engine:
    """The servers at ``engine_urls`` once healthy, else the embedded engine on ``model_path``.

    The engine is started but not entered: use it as ``async with engine:`` so that it is
    closed. ``client_options`` go to :class:`~toolrollout.engines.SGLangClient`.
    """
    if engine_urls:
        from .sglang import SGLangClient

        client = SGLangClient(list(engine_urls), **client_options)
        try:
            await client.wait_healthy(timeout=health_timeout)
        except BaseException:
            await client.aclose()
            raise
        return client
    if model_path is None:
        from toolrollout._exceptions import UserError

        raise UserError("connect needs engine URLs or a model folder for the embedded engine")
    from .embedded import EmbeddedEngine

    embedded = EmbeddedEngine(Path(model_path), num_threads=threads)
    await embedded.start()
    return embedded


async def discover_context_length(engine: Engine) -> int | None:
    """The engine's context length in tokens, or ``None`` when it does not report one."""
    server_info = getattr(engine, "server_info", None)
    if server_info is not None:  # SGLang-compatible servers
        raw = (await server_info()).get("context_length")
        return int(raw) if isinstance(raw, int) else None
    length = getattr(engine, "context_length", None)  # the embedded engine
    return int(length) if isinstance(length, int) else None


async def abort_all_requests(engine: Engine) -> None:
    """Abort every in-flight request of ``engine`` (shutdown on a signal)."""
    abort_all = getattr(engine, "abort_all", None)
    if abort_all is not None:
        await abort_all()
        return
    abort_nowait = getattr(engine, "abort_nowait", None)
    if abort_nowait is not None:  # the embedded engine
        abort_nowait(abort_all=True)
