"""Gateway mode: an OpenAI/Anthropic-compatible proxy that records token-exact sessions."""

from ._types import ChatChoice, ChatRequest, ChatResult, GatewayError, ToolCallOut

__all__ = ["ChatChoice", "ChatRequest", "ChatResult", "GatewayError", "ToolCallOut"]
