"""Gateway mode: an OpenAI/Anthropic-compatible proxy that records token-exact sessions.

A harness (an agent written with the OpenAI or Anthropic SDK, an agent framework, a coding
CLI) points its base URL at the gateway; the gateway renders its messages with the chat
template, generates token-in/token-out, answers in the API's own shape and records every
session as token-exact trajectory rows for the trainer. See docs/gateway.md.
"""

from ._app import build_app, gateway_security
from ._core import Gateway, GatewayConfig
from ._http import complete_or_abort, open_stream, session_key
from ._types import (
    ChatChoice,
    ChatRequest,
    ChatResult,
    GatewayError,
    StreamDelta,
    StreamStart,
    ToolCallOut,
)

__all__ = [
    "ChatChoice",
    "ChatRequest",
    "ChatResult",
    "Gateway",
    "GatewayConfig",
    "GatewayError",
    "StreamDelta",
    "StreamStart",
    "ToolCallOut",
    "build_app",
    "complete_or_abort",
    "gateway_security",
    "open_stream",
    "session_key",
]
