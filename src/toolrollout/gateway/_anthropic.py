"""Anthropic Messages (``POST /v1/messages``) on the gateway (filled in by its own layer)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI

if TYPE_CHECKING:
    from ._core import Gateway

__all__ = ["add_anthropic_routes"]


def add_anthropic_routes(app: FastAPI, gateway: Gateway) -> None:
    """Register the Anthropic Messages routes on ``app``."""
