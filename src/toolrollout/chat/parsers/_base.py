"""The tool-call parser interface, its result types, shared helpers and the registry.

Parsers never raise on model output and never evaluate it: a malformed call becomes a
:class:`MalformedCall` with a message for the model (counted as a ``parse_error``), because
a bad call is model behaviour to learn from, not a crash. Whether a called tool exists is
the tool executor's business; a parser only *flags* names outside ``known_tools``.
"""

from __future__ import annotations

import json
import math
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, final

from ..._exceptions import ToolParseError, UserError

__all__ = [
    "MalformedCall",
    "ParsedTurn",
    "ToolCall",
    "ToolCallParser",
    "get_tool_parser",
    "register_tool_parser",
    "tool_parser_names",
]

END_OF_TURN_STRINGS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "</s>",
    "<｜end▁of▁sentence｜>",
)
"""End-of-turn markers of the common families: stripped from parsed content, and held back
by the gateway's streams (a stream must never show one)."""
_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One well-formed tool call."""

    id: str
    """Call id, unique within the turn (model-given where the format has one)."""
    name: str
    """Tool name as the model wrote it (not checked against a registry)."""
    arguments: dict[str, Any]
    """Decoded arguments: a JSON object (plain dict/list/str/int/float/bool/None values)."""

    def to_dict(self) -> dict[str, Any]:
        """OpenAI-style ``tool_calls`` entry, arguments kept as an object (chat templates
        render them with ``tojson``, so an object is what re-renders to the model's text)."""
        return call_entry(self.id, self.name, self.arguments)


def call_entry(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """An OpenAI-style ``tool_calls`` entry."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@dataclass(frozen=True, slots=True)
class MalformedCall:
    """A tool call the parser recognised as an attempt but could not accept."""

    message: str
    """Human-readable reason, fit to show the model."""
    raw: str
    """The offending text (possibly truncated)."""


@dataclass(frozen=True, slots=True)
class ParsedTurn:
    """What one model turn says: content, tool calls and parse errors."""

    content: str
    """Text outside the tool calls (and outside the reasoning block), stripped."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Well-formed calls, in order."""
    errors: tuple[MalformedCall, ...] = ()
    """One entry per malformed call."""
    reasoning: str | None = None
    """Text of a ``<think>…</think>`` block, if the turn had one."""
    unknown_tools: tuple[str, ...] = ()
    """Names of calls not in the parser's ``known_tools`` (empty when none were given)."""

    @property
    def ok(self) -> bool:
        """True when no call was malformed."""
        return not self.errors

    def raise_for_errors(self) -> None:
        """Raise :class:`ToolParseError` if any call was malformed (for strict callers)."""
        if self.errors:
            joined = "; ".join(error.message for error in self.errors)
            raise ToolParseError(
                f"{len(self.errors)} malformed tool call(s): {joined}", errors=self.errors
            )


def _random_call_id(index: int) -> str:
    del index
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallParser(ABC):
    """Base class of the parsers: a format implements :meth:`parse_body`, and :meth:`parse`
    adds the shared steps (trailing stop token, ``<think>`` block, unknown-name flags)."""

    name: ClassVar[str] = ""
    """Registry name of the format."""
    call_markers: ClassVar[tuple[str, ...] | None] = None
    """Strings that may begin a tool call in this format, wherever they appear. A streaming
    caller may show the text before the first one as content while the turn is still being
    generated; None (unknown) means it must hold all text until the turn is parsed."""
    splits_think_tags: ClassVar[bool] = True
    """Whether :meth:`parse` splits off a ``<think>`` block as the reasoning. False for
    formats that mark reasoning themselves (harmony's analysis channel): their
    :meth:`parse_body` sets :attr:`ParsedTurn.reasoning`."""

    def __init__(
        self,
        *,
        known_tools: Collection[str] | None = None,
        id_factory: Callable[[int], str] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Args:
        known_tools: tool names to flag unknown calls against (flag only, not reject).
        id_factory: makes a call id from the call's index in the turn; random by default.
            Pass a deterministic one for reproducible trajectories.
        tools: OpenAI-style tool schemas, for formats whose values carry no type of their
            own (GLM-4.5 writes every argument as text; the schema says which are strings).
        """
        self._known_tools = frozenset(known_tools) if known_tools is not None else None
        self._id_factory = id_factory or _random_call_id
        self._tool_schemas = _parameters_by_name(tools or ())

    def _properties(self, name: str) -> Mapping[str, Any]:
        """The ``properties`` of tool ``name``'s parameter schema (empty when unknown)."""
        properties = self._tool_schemas.get(name, {}).get("properties")
        return properties if isinstance(properties, Mapping) else {}

    @final
    def parse(self, text: str) -> ParsedTurn:
        """Parse one model turn's text. Never raises on model output, never evaluates it."""
        body = _strip_stop(text)
        reasoning: str | None = None
        if self.splits_think_tags:
            reasoning, body = _split_reasoning(body)
        parsed = self.parse_body(body)
        if not self.splits_think_tags:
            reasoning = parsed.reasoning
        unknown: tuple[str, ...] = ()
        if self._known_tools is not None:
            unknown = tuple(
                call.name for call in parsed.tool_calls if call.name not in self._known_tools
            )
        return replace(parsed, reasoning=reasoning, unknown_tools=unknown)

    def forced_call_prefix(self, name: str | None = None) -> str | None:
        """The text a call of this format starts with, to make a turn a call by forcing
        it into the generation (``tool_choice``): the opener, and with ``name`` the call's
        head up to where its arguments begin, when the format has a fixed one. None: the
        format has no fixed opener (for ``name``: none that names the tool)."""
        del name
        return None

    @abstractmethod
    def parse_body(self, text: str) -> ParsedTurn:
        """Parse text without reasoning or stop token; must not raise on any input."""

    def make_id(self, index: int) -> str:
        """Call id for the ``index``-th call of a turn."""
        return self._id_factory(index)


def _parameters_by_name(
    tools: Sequence[Mapping[str, Any]],
) -> Mapping[str, Mapping[str, Any]]:
    schemas: dict[str, Mapping[str, Any]] = {}
    for tool in tools:
        function = tool.get("function", tool)
        if not isinstance(function, Mapping):
            continue
        name, parameters = function.get("name"), function.get("parameters")
        if isinstance(name, str) and isinstance(parameters, Mapping):
            schemas[name] = parameters
    return schemas


def _strip_stop(text: str) -> str:
    for stop in END_OF_TURN_STRINGS:
        if text.endswith(stop):
            return text[: -len(stop)]
    return text


def _split_reasoning(text: str) -> tuple[str | None, str]:
    """Split off a leading ``<think>`` block (or one opened by the prompt)."""
    close = text.find(_THINK_CLOSE)
    stripped = text.lstrip()
    if close == -1:
        if stripped.startswith(_THINK_OPEN):
            # Unterminated reasoning: the turn never left the think block.
            return stripped[len(_THINK_OPEN) :].strip(), ""
        return None, text
    open_ = text.find(_THINK_OPEN)
    if open_ == -1 or open_ > close:
        # The generation prompt opened the block (Qwen3 thinking templates).
        return text[:close].strip(), text[close + len(_THINK_CLOSE) :]
    if text[:open_].strip():
        return None, text
    return text[open_ + len(_THINK_OPEN) : close].strip(), text[close + len(_THINK_CLOSE) :]


# -- helpers shared by the JSON-based formats ---------------------------------------------

_RAW_LIMIT = 200


def clip(text: str) -> str:
    """Shorten ``text`` for error records."""
    return text if len(text) <= _RAW_LIMIT else text[:_RAW_LIMIT] + "…"


def _reject_constant(constant: str) -> Any:
    raise ValueError(f"{constant} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of a float's range")
    return value


JSON_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)
"""Strict decoder: NaN/Infinity are rejected, as JSON requires, and so is a number too
large for a float (``1e999`` would become ``inf``, which the template cannot render back)."""


def loads(text: str) -> tuple[Any, str | None]:
    """Decode JSON; return ``(value, None)`` or ``(None, reason)``. Never raises."""
    try:
        return JSON_DECODER.decode(text), None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        return None, f"invalid JSON ({exc})"


def raw_decode(text: str, index: int) -> tuple[Any, int, str | None]:
    """Decode one JSON value at ``index``; return ``(value, end, None)`` or an error."""
    try:
        value, end = JSON_DECODER.raw_decode(text, index)
    except (ValueError, RecursionError) as exc:
        return None, index, f"invalid JSON ({exc})"
    return value, end, None


def call_from_json(payload: str, name: str, raw: str) -> tuple[str, dict[str, Any]] | MalformedCall:
    """The call to ``name`` with the JSON arguments ``payload``, which must be an object
    (one place for these errors, so their messages read the same in every parser)."""
    value, error = loads(payload)
    if error is not None:
        return MalformedCall(f"{error} in the arguments of the call to {name!r}", clip(raw))
    return (name, value) if isinstance(value, dict) else not_an_object(name, value, raw)


def not_an_object(name: str, arguments: Any, raw: str) -> MalformedCall:
    """The error for arguments that decoded to something other than a JSON object."""
    return MalformedCall(
        f"the arguments of the call to {name!r} must be a JSON object, "
        f"got {type(arguments).__name__}",
        clip(raw),
    )


WHITESPACE = " \t\r\n"


def skip_whitespace(text: str, index: int) -> int:
    """The first index at or after ``index`` that is not JSON whitespace."""
    while index < len(text) and text[index] in WHITESPACE:
        index += 1
    return index


def call_from_object(obj: Any, raw: str) -> tuple[str, dict[str, Any]] | MalformedCall:
    """Validate a decoded ``{"name": ..., "arguments"|"parameters": {...}}`` object."""
    if not isinstance(obj, dict):
        return MalformedCall(
            f"a tool call must be a JSON object with 'name' and 'arguments', "
            f"got {type(obj).__name__}",
            clip(raw),
        )
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return MalformedCall("the tool call has no 'name' string", clip(raw))
    name = name.strip()
    if "arguments" in obj:
        arguments = obj["arguments"]
    elif "parameters" in obj:
        arguments = obj["parameters"]
    else:
        arguments = {}
    if isinstance(arguments, str):
        decoded, error = loads(arguments)
        if error is not None:
            return MalformedCall(
                f"the arguments of the call to {name!r} are a string that is not JSON",
                clip(raw),
            )
        arguments = decoded
    return (name, arguments) if isinstance(arguments, dict) else not_an_object(name, arguments, raw)


def join_content(parts: Iterable[str]) -> str:
    """Join the non-call text segments of a turn."""
    return "\n".join(part.strip() for part in parts if part.strip())


def split_blocks(
    text: str, open_tag: str, close_tag: str
) -> tuple[list[str], list[str], str | None]:
    """Cut ``text`` at its ``open_tag``…``close_tag`` blocks.

    Returns the text around the blocks (one piece more than there are blocks), the block
    bodies, and the text from an opener that is never closed (``None`` when every one is).
    """
    outside: list[str] = []
    bodies: list[str] = []
    position = 0
    while True:
        start = text.find(open_tag, position)
        if start == -1:
            outside.append(text[position:])
            return outside, bodies, None
        outside.append(text[position:start])
        body_start = start + len(open_tag)
        end = text.find(close_tag, body_start)
        if end == -1:
            return outside, bodies, text[start:]
        bodies.append(text[body_start:end])
        position = end + len(close_tag)


class TaggedCallParser(ToolCallParser):
    """Calls in ``open_tag``…``close_tag`` blocks; the text outside them is content."""

    open_tag: ClassVar[str] = "<tool_call>"
    close_tag: ClassVar[str] = "</tool_call>"
    call_markers: ClassVar[tuple[str, ...] | None] = ("<tool_call>",)

    def parse_body(self, text: str) -> ParsedTurn:
        collector = CallCollector(self)
        outside, blocks, unterminated = split_blocks(text, self.open_tag, self.close_tag)
        segments: list[str] = []
        for index, segment in enumerate(outside):
            segments.append(self._outside(segment, collector))
            if index < len(blocks):
                self._parse_block(blocks[index], collector)
        if unterminated is not None:
            collector.error(
                f"unterminated {self.open_tag}: the call must end with {self.close_tag}",
                unterminated,
            )
        return collector.turn(join_content(segments))

    @abstractmethod
    def _parse_block(self, block: str, collector: CallCollector) -> None:
        """Record the call(s) or the error(s) of one block's body."""

    def _outside(self, segment: str, collector: CallCollector) -> str:
        """The content of the text between blocks (a format may find errors there)."""
        del collector
        return segment


class SectionCallParser(ToolCallParser):
    """Calls in ``call_open``…``call_close`` blocks inside a ``section_open`` section."""

    section_open: ClassVar[str]
    section_close: ClassVar[str]
    call_open: ClassVar[str]
    call_close: ClassVar[str]
    text_between_calls_is_error: ClassVar[bool] = False

    def forced_call_prefix(self, name: str | None = None) -> str | None:
        opener = self.section_open + self.call_open
        return opener if name is None else opener + self._named_head(name)

    @abstractmethod
    def _named_head(self, name: str) -> str:
        """What a call to ``name`` writes after ``call_open``, up to its arguments."""

    def _parse_section(self, body: str, collector: CallCollector) -> None:
        """Record the calls of a section's ``body``; a section without any is an error."""
        between, calls, unterminated = split_blocks(body, self.call_open, self.call_close)
        for index, gap in enumerate(between):
            if self.text_between_calls_is_error and gap.strip():
                collector.error("text between tool calls", gap)
            if index < len(calls):
                self._parse_call(calls[index], collector)
        if unterminated is not None:
            collector.error(f"unterminated tool call: missing {self.call_close}", unterminated)
        if not collector.calls and not collector.errors:
            collector.error("the tool-call section contains no call", body)

    @abstractmethod
    def _parse_call(self, inner: str, collector: CallCollector) -> None:
        """Record the call (or the error) of one block's body."""


class CallCollector:
    """Accumulates calls and errors while a parser walks the text."""

    __slots__ = ("_parser", "calls", "errors")

    def __init__(self, parser: ToolCallParser) -> None:
        self._parser = parser
        self.calls: list[ToolCall] = []
        self.errors: list[MalformedCall] = []

    def add(self, result: tuple[str, dict[str, Any]] | MalformedCall, call_id: str = "") -> None:
        """Record a validated call (with an optional model-given id) or an error."""
        if isinstance(result, MalformedCall):
            self.errors.append(result)
            return
        name, arguments = result
        index = len(self.calls)
        self.calls.append(ToolCall(call_id or self._parser.make_id(index), name, arguments))

    def add_object(self, obj: Any, raw: str) -> None:
        """Record one decoded call object, or each element of a list of them."""
        if isinstance(obj, list):
            if not obj:
                self.errors.append(MalformedCall("empty list of tool calls", clip(raw)))
            for element in obj:
                self.add(call_from_object(element, raw))
        else:
            self.add(call_from_object(obj, raw))

    def error(self, message: str, raw: str) -> None:
        """Record a malformed call."""
        self.errors.append(MalformedCall(message, clip(raw)))

    def turn(self, content: str) -> ParsedTurn:
        """Freeze into a :class:`ParsedTurn`."""
        return ParsedTurn(content=content, tool_calls=tuple(self.calls), errors=tuple(self.errors))


# -- registry -----------------------------------------------------------------------------

_REGISTRY: dict[str, type[ToolCallParser]] = {}


def register_tool_parser(
    name: str, parser_cls: type[ToolCallParser], *, overwrite: bool = False
) -> None:
    """Register ``parser_cls`` under ``name`` (refuses to overwrite unless ``overwrite``)."""
    if not overwrite and name in _REGISTRY and _REGISTRY[name] is not parser_cls:
        raise UserError(f"a tool parser named {name!r} is already registered")
    _REGISTRY[name] = parser_cls


def get_tool_parser(
    name: str,
    *,
    known_tools: Collection[str] | None = None,
    id_factory: Callable[[int], str] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> ToolCallParser:
    """Build the parser registered as ``name``; raise :class:`UserError` if unknown.

    ``tools`` (OpenAI-style schemas) lets schema-typed formats such as ``glm45`` type the
    argument values.
    """
    try:
        parser_cls = _REGISTRY[name]
    except KeyError:
        known = ", ".join(tool_parser_names())
        raise UserError(f"unknown tool parser {name!r}; known: {known}") from None
    return parser_cls(known_tools=known_tools, id_factory=id_factory, tools=tools)


def tool_parser_names() -> tuple[str, ...]:
    """Registered parser names, sorted."""
    return tuple(sorted(_REGISTRY))
