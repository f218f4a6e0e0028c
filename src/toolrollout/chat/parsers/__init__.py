"""Tool-call parsers, one per model family's output format, behind a registry.

``get_tool_parser(name).parse(text)`` returns a :class:`ParsedTurn`: content, well-formed
:class:`ToolCall` s and one :class:`MalformedCall` per call that could not be accepted.
Parsers never raise on model output and never evaluate it. The registered names (SGLang's
``--tool-call-parser`` names) are listed below and by :func:`tool_parser_names`.
"""

from __future__ import annotations

from ._base import MalformedCall as MalformedCall
from ._base import ParsedTurn as ParsedTurn
from ._base import ToolCall as ToolCall
from ._base import ToolCallParser as ToolCallParser
from ._base import get_tool_parser as get_tool_parser
from ._base import register_tool_parser as register_tool_parser
from ._base import tool_parser_names as tool_parser_names
from ._formats import DeepSeekV3Parser as DeepSeekV3Parser
from ._formats import DeepSeekV31Parser as _DeepSeekV31Parser
from ._formats import HermesParser as HermesParser
from ._formats import Llama3JsonParser as Llama3JsonParser
from ._formats import MistralParser as MistralParser
from ._glm45 import Glm45Parser as Glm45Parser
from ._gpt_oss import GptOssParser as GptOssParser
from ._kimi_k2 import KimiK2Parser as KimiK2Parser
from ._pythonic import PythonicParser as PythonicParser
from ._qwen3_coder import Qwen3CoderParser as Qwen3CoderParser

__all__ = [
    "DeepSeekV3Parser",
    "Glm45Parser",
    "GptOssParser",
    "HermesParser",
    "KimiK2Parser",
    "Llama3JsonParser",
    "MalformedCall",
    "MistralParser",
    "ParsedTurn",
    "PythonicParser",
    "Qwen3CoderParser",
    "ToolCall",
    "ToolCallParser",
    "get_tool_parser",
    "register_tool_parser",
    "tool_parser_names",
]

for _name, _cls in (
    ("deepseekv3", DeepSeekV3Parser),
    ("deepseekv31", _DeepSeekV31Parser),
    ("glm45", Glm45Parser),
    ("gpt-oss", GptOssParser),
    ("kimi_k2", KimiK2Parser),
    ("hermes", HermesParser),
    ("llama3", Llama3JsonParser),
    ("mistral", MistralParser),
    ("pythonic", PythonicParser),
    ("qwen25", HermesParser),
    ("qwen3", HermesParser),
    ("qwen3_coder", Qwen3CoderParser),
):
    register_tool_parser(_name, _cls)
del _name, _cls
