"""Token-exact chat transcripts and tool-call parsing.

* :class:`ChatFormat` renders the prompt once and computes the token delta of each tool
  turn (boundary tokens included), so a rollout never re-tokenizes earlier turns.
* :func:`check_drift` compares a transcript with a fresh render and classifies any
  difference, without touching the tokens.
* :func:`get_tool_parser` returns the tool-call parser of a model family.

Each model family (stop tokens, boundary, parser, message form, documented rewrites) is a
:class:`TemplateFamily`; the built-in ones are in :mod:`toolrollout.chat.families` and
available from :func:`template_families`.
Concrete parser classes live in :mod:`toolrollout.chat.parsers`.
"""

from __future__ import annotations

from ._drift import DriftReport as DriftReport
from ._drift import check_drift as check_drift
from ._format import ChatFormat as ChatFormat
from ._format import Message as Message
from ._multimodal import VisionFormat as VisionFormat
from .families import TemplateFamily as TemplateFamily
from .families import template_families as template_families
from .parsers import ParsedTurn as ParsedTurn
from .parsers import ToolCall as ToolCall
from .parsers import ToolCallParser as ToolCallParser
from .parsers import register_tool_parser as register_tool_parser

__all__ = [
    "ChatFormat",
    "DriftReport",
    "Message",
    "ParsedTurn",
    "TemplateFamily",
    "ToolCall",
    "ToolCallParser",
    "VisionFormat",
    "check_drift",
    "register_tool_parser",
    "template_families",
]
