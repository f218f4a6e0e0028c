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

from ._drift import DriftKind as DriftKind
from ._drift import DriftReport as DriftReport
from ._drift import check_drift as check_drift
from ._format import ChatFormat as ChatFormat
from ._format import Message as Message
from ._multimodal import ImageRun as ImageRun
from ._multimodal import PreparedImage as PreparedImage
from ._multimodal import VisionFormat as VisionFormat
from ._multimodal import load_image as load_image
from .families import CallIdRequest as CallIdRequest
from .families import TemplateFamily as TemplateFamily
from .families import TemplateProbe as TemplateProbe
from .families import detect_template_family as detect_template_family
from .families import get_template_family as get_template_family
from .families import template_families as template_families
from .parsers import MalformedCall as MalformedCall
from .parsers import ParsedTurn as ParsedTurn
from .parsers import ToolCall as ToolCall
from .parsers import ToolCallParser as ToolCallParser
from .parsers import get_tool_parser as get_tool_parser
from .parsers import register_tool_parser as register_tool_parser
from .parsers import tool_parser_names as tool_parser_names

__all__ = [
    "CallIdRequest",
    "ChatFormat",
    "DriftKind",
    "DriftReport",
    "ImageRun",
    "MalformedCall",
    "Message",
    "ParsedTurn",
    "PreparedImage",
    "TemplateFamily",
    "TemplateProbe",
    "ToolCall",
    "ToolCallParser",
    "VisionFormat",
    "check_drift",
    "detect_template_family",
    "get_template_family",
    "get_tool_parser",
    "load_image",
    "register_tool_parser",
    "template_families",
    "tool_parser_names",
]
