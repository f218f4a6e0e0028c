"""The gateway's canonical request and result (the seam between the HTTP APIs and the
core), its errors and its configuration.

Every API the gateway speaks (OpenAI Chat Completions, OpenAI Responses, Anthropic Messages)
is translated into one :class:`ChatRequest` in OpenAI chat-message form, served by
``Gateway.complete``, and its :class:`ChatResult` is translated back into that API's shape.
Keeping one canonical form means the session matching, the template deltas and the records
are written once, whatever the harness speaks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from toolrollout._exceptions import UserError
from toolrollout.chat.parsers import get_tool_parser

__all__ = [
    "ChatChoice",
    "ChatRequest",
    "ChatResult",
    "GatewayConfig",
    "GatewayError",
    "GatewayErrorKind",
    "StreamDelta",
    "StreamStart",
    "ToolCallOut",
    "invalid",
]

FinishReason = Literal["stop", "length", "tool_calls"]
GatewayErrorKind = Literal[
    "invalid_request",
    "context_length_exceeded",
    "overloaded",
    "timeout",
    "engine_error",
    "tool_choice_unmet",
]


@dataclass(frozen=True)
class ChatRequest:
    """One model call of a harness, in OpenAI chat form.

    ``messages`` are OpenAI chat messages: ``role`` (system/developer/user/assistant/tool),
    ``content`` (a string or a list of parts), an assistant's ``tool_calls``
    (``[{"id", "type": "function", "function": {"name", "arguments": <JSON text>}}]``) and
    ``reasoning_content`` where the harness sends it back, a tool message's
    ``tool_call_id``. ``tools`` are OpenAI function tools
    (``{"type": "function", "function": {"name", "description", "parameters"}}``).
    ``session`` is the session key the HTTP layer resolved (header, API key or path).
    """

    session: str
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] | None = None
    n: int = 1
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    model: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCallOut:
    """A parsed tool call of the model, ``arguments`` as JSON text (OpenAI's shape)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChatChoice:
    """One sampled answer: its text, reasoning (when the family separates it) and calls."""

    index: int
    content: str
    reasoning: str | None
    tool_calls: tuple[ToolCallOut, ...]
    finish_reason: FinishReason


@dataclass(frozen=True)
class ChatResult:
    """What ``Gateway.complete`` returns: ``n`` choices and token usage."""

    id: str
    model: str
    created: int
    choices: tuple[ChatChoice, ...]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0


@dataclass(frozen=True)
class StreamStart:
    """The first item of :meth:`Gateway.stream`: the answer is being generated (its first
    tokens are decoded); errors before it are the request's, errors after it the stream's."""

    id: str
    model: str
    created: int
    prompt_tokens: int


@dataclass(frozen=True)
class StreamDelta:
    """A piece of a turn's reasoning or content, sent before the turn is finished. The
    deltas of a stream add up to the final :class:`ChatChoice`'s ``reasoning`` and
    ``content``."""

    kind: Literal["reasoning", "content"]
    text: str


class GatewayError(Exception):
    """A request the gateway answers with an error in the API's own shape: ``kind`` is
    API-neutral, and each API layer maps it to its error body (and Anthropic's status)."""

    def __init__(self, kind: GatewayErrorKind, message: str, *, status: int) -> None:
        super().__init__(message)
        self.kind: GatewayErrorKind = kind
        self.message = message
        self.status = status


def invalid(message: str, *, status: int = 400) -> GatewayError:
    """A bad request (400 unless told), answered in the API's own shape."""
    return GatewayError("invalid_request", message, status=status)


@dataclass(frozen=True, kw_only=True)
class GatewayConfig:
    """Limits and model options of a gateway (every one has a CLI flag of the same name).

    ``context_length`` None: the engine's. ``idle_timeout`` None: sessions close only when
    told. ``max_segments`` bounds one session's memory (each segment holds at most a
    context of ids); ``max_open_segments`` bounds the segments a request is matched against
    (the least recently used one stops being extendable beyond it).
    """

    model_name: str = "toolrollout"
    family: str | None = None
    tool_parser: str | None = None
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    context_length: int | None = None
    default_max_tokens: int = 1024
    max_n: int = 16
    max_concurrency: int = 64
    max_waiting: int = 1024
    request_timeout: float = 600.0
    idle_timeout: float | None = 600.0
    max_sessions: int = 4096
    max_segments: int = 64
    max_open_segments: int = 8
    max_stored_responses: int = 1024
    """Responses kept for ``previous_response_id`` and ``GET /v1/responses/{id}`` (the
    least recently used is dropped beyond it)."""
    max_records: int = 10_000
    """Closed sessions' rows kept in memory for :meth:`Gateway.records` (newest kept)."""
    flush_seconds: float = 10.0

    def __post_init__(self) -> None:
        for name in (
            "max_n",
            "max_concurrency",
            "max_waiting",
            "max_sessions",
            "max_segments",
            "max_stored_responses",
            "max_open_segments",
        ):
            if int(getattr(self, name)) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be at least 1")
        if not self.request_timeout > 0:
            raise UserError("--request-timeout must be positive")
        if self.idle_timeout is not None and not self.idle_timeout > 0:
            raise UserError("--idle-timeout must be positive")
        if self.tool_parser is not None:
            get_tool_parser(self.tool_parser)  # an unknown name fails now, not per request
