"""The engine seam: one small interface behind which every backend sits.

The rollout loop only ever talks to :class:`Engine`. Three implementations exist: the HTTP
client for SGLang-compatible servers (``SGLangClient``), the in-process embedded engine
(``EmbeddedEngine``) and the scripted engine for tests (``toolrollout.testing``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

from ._types import GenerateRequest, GenerateResult

__all__ = ["Engine"]


class Engine(ABC):
    """Token-in/token-out generation with abort."""

    @abstractmethod
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Generate one sample for ``request`` (``request.sampling.n`` must be 1)."""

    @abstractmethod
    async def abort(self, rid: str) -> None:
        """Abort a running request; its ``generate`` call returns the partial output."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release connections, threads and models."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
