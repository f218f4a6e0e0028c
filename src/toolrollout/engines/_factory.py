"""One place that turns "where is the model" into a running engine, and asks it about itself.

``connect``, the engine factory every entry point shares: engine URLs give an SGLang or
vLLM client once healthy, a model folder the embedded CPU engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from ._base import Engine
    from ._http_client import HTTPClient

__all__ = ["ENGINE_KINDS", "EngineKind", "connect"]

EngineKind = Literal["auto", "sglang", "vllm"]
ENGINE_KINDS: tuple[EngineKind, ...] = ("auto", "sglang", "vllm")


async def connect(
    engine_urls: Sequence[str] = (),
    model_path: str | Path | None = None,
    *,
    threads: int | None = None,
    health_timeout: float = 120.0,
    engine: EngineKind = "auto",
    **client_options: Any,
) -> Engine:
    """The servers at ``engine_urls`` once healthy, else the embedded engine on ``model_path``.

    ``engine`` names the servers' kind, or ``auto`` finds it. The engine is started but not
    entered: use it as ``async with engine:`` so that it is closed.
    """
    if engine not in ENGINE_KINDS:
        from toolrollout._exceptions import UserError

        raise UserError(f"--engine must be one of {', '.join(ENGINE_KINDS)}, got {engine!r}")
    if engine_urls:
        from .sglang import SGLangClient
        from .vllm import VLLMClient

        client: HTTPClient = (VLLMClient if engine == "vllm" else SGLangClient)(
            list(engine_urls), **client_options
        )
        try:
            await client.wait_healthy(timeout=health_timeout)
            found = await _one_kind(client, engine)
            if found == "vllm" and not isinstance(client, VLLMClient):
                await client.aclose()
                client = VLLMClient(list(engine_urls), **client_options)
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


async def _one_kind(client: HTTPClient, named: EngineKind) -> str:
    """The one kind of every server of ``client``; a mix, or a kind other than the one
    ``named``, is refused with one line."""
    from toolrollout._exceptions import UserError

    kinds = {url: await client.server_kind(url) for url in client.base_urls}
    found = set(kinds.values())
    if len(found) > 1:
        listed = ", ".join(f"{url} ({kind})" for url, kind in kinds.items())
        raise UserError(f"--engine-url mixes engine kinds ({listed}); a run uses one kind")
    kind = found.pop()
    if named != "auto" and kind != named:
        raise UserError(f"--engine {named}, but {', '.join(kinds)} serves {kind}")
    return kind
