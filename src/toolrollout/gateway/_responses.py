"""OpenAI Responses (``POST /v1/responses``) on the gateway (filled in by its own layer)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI

if TYPE_CHECKING:
    from ._core import Gateway

__all__ = ["add_responses_routes"]


def add_responses_routes(app: FastAPI, gateway: Gateway) -> None:
    """Register the Responses API routes on ``app``."""
