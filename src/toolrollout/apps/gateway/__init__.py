"""Gateway mode: an OpenAI/Anthropic-compatible proxy that records token-exact sessions.

A harness (an agent written with the OpenAI or Anthropic SDK, an agent framework, a coding
CLI) points its base URL at the gateway; the gateway renders its messages with the chat
template, generates token-in/token-out, answers in the API's own shape and records every
session as token-exact trajectory rows for the trainer. See docs/gateway.md.
"""

from ._app import build_app, gateway_security
from ._core import Gateway
from ._types import ChatRequest, ChatResult, GatewayConfig, GatewayError

__all__ = [
    "ChatRequest",
    "ChatResult",
    "Gateway",
    "GatewayConfig",
    "GatewayError",
    "build_app",
    "gateway_security",
]
