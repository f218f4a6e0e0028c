"""One place that turns "where is the model" into a running engine, and asks it about itself.

``connect`` is the engine factory every entry point shares: engine URLs give a
:class:`~toolrollout.engines.SGLangClient` (once its servers are healthy), a model folder
gives the embedded CPU engine. What a run then asks an engine (its context length, whether
it takes images, aborting everything on shutdown) goes through the one control interface
every engine implements (:meth:`Engine.info`, :meth:`Engine.abort_all`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._base import Engine

__all__ = ["connect"]


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
