"""Values of the engine control plane: what an engine serves, and what a weight update did.

Every engine answers the same control calls with these frozen records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Self

from .._exceptions import EngineError

__all__ = [
    "EngineInfo",
    "EngineServersFailed",
    "PauseMode",
    "ServerInfo",
    "ServerWeightUpdate",
    "WeightUpdate",
]

PauseMode = Literal["abort", "retract", "in_place"]
"""SGLang's pause modes: ``abort`` ends running requests with their partial output;
``retract`` and ``in_place`` keep them and resume them on ``continue_generation``."""


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What one server (or the one in-process model) reports about itself."""

    url: str
    """The server's base URL; ``embedded://`` / ``scripted://`` for in-process engines."""
    model_path: str | None
    weight_version: str | None
    context_length: int | None
    """Most tokens (prompt plus generated) one request may hold; None when not reported."""
    vision: bool
    """Whether the served model takes images (SGLang's ``has_image_understanding``)."""
    engine: str | None = None
    """What serves it: ``"sglang"``, ``"toolrollout-embedded"`` (``toolrollout serve`` or
    the in-process engine), ``"scripted"``...; None when the server does not say."""
    engine_version: str | None = None
    """That engine's version, as it reports it."""
    dtype: str | None = None
    """The dtype it serves the model in, as it reports it (SGLang: its ``--dtype``, which
    may be ``"auto"``)."""


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What the engine serves, merged over its servers.

    The strictest value: the smallest context length, ``vision`` only when every server takes
    images, a model path or weight version only when all agree (else ``None``).
    """

    context_length: int | None
    vision: bool
    model_path: str | None
    weight_version: str | None
    servers: tuple[ServerInfo, ...] = ()
    engine: str | None = None
    engine_version: str | None = None
    dtype: str | None = None
    """The servers' engine, version and dtype, each when all servers agree (else None)."""

    @classmethod
    def merge(cls, servers: tuple[ServerInfo, ...]) -> Self:
        """The engine-wide view of ``servers`` (see the class docstring)."""
        lengths = [s.context_length for s in servers if s.context_length is not None]

        def agreed(values: set[str | None]) -> str | None:
            return values.pop() if len(values) == 1 else None

        return cls(
            context_length=min(lengths) if len(lengths) == len(servers) and lengths else None,
            vision=bool(servers) and all(s.vision for s in servers),
            model_path=agreed({s.model_path for s in servers}),
            weight_version=agreed({s.weight_version for s in servers}),
            servers=servers,
            engine=agreed({s.engine for s in servers}),
            engine_version=agreed({s.engine_version for s in servers}),
            dtype=agreed({s.dtype for s in servers}),
        )


@dataclass(frozen=True, slots=True)
class ServerWeightUpdate:
    """One server's answer to a weight update (SGLang's ``/update_weights_from_disk``)."""

    url: str
    message: str
    num_paused_requests: int
    """Requests that were paused across the swap and continue on the new weights."""


@dataclass(frozen=True, slots=True)
class WeightUpdate:
    """The outcome of ``update_weights_from_disk``: every server now serves ``model_path``."""

    model_path: str
    weight_version: str | None
    """The version label asked for; None when the call kept each server's current label."""
    servers: tuple[ServerWeightUpdate, ...]

    @property
    def num_paused_requests(self) -> int:
        """Paused requests over all servers."""
        return sum(s.num_paused_requests for s in self.servers)


class EngineServersFailed(ExceptionGroup[EngineError], EngineError):
    """A control call failed on several servers; carries each server's error.

    An :class:`EngineError` and an :class:`ExceptionGroup`; ``errors`` maps each failed
    server's URL to its error. A failure on a single server raises that error itself.
    """

    errors: Mapping[str, EngineError]

    def __new__(cls, what: str, errors: Mapping[str, EngineError]) -> Self:
        detail = "; ".join(f"{url}: {exc}" for url, exc in errors.items())
        message = f"{what} failed on {len(errors)} servers: {detail}"
        self = super().__new__(cls, message, list(errors.values()))
        self.errors = dict(errors)
        return self

    def __init__(self, what: str, errors: Mapping[str, EngineError]) -> None:
        super().__init__(self.message, list(self.errors.values()))

    def derive(self, excs: object) -> ExceptionGroup[EngineError]:  # type: ignore[override]
        """Sub-groups made by ``split``/``except*`` are plain groups (the URLs are lost)."""
        return ExceptionGroup(self.message, list(excs))  # type: ignore[call-overload]
