"""What one model family is, as data: its template rules and its tool-call parser.

Families are detected from what a template *renders* for a small probe conversation
(:class:`TemplateProbe`), so a template is recognised by its output format, not merely by
which control tokens it mentions. The registry is :mod:`toolrollout.chat.families`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..parsers._base import call_entry

if TYPE_CHECKING:
    from ..parsers import ParsedTurn

__all__ = [
    "PROBE_MESSAGES",
    "PROBE_TOOLS",
    "CallIdRequest",
    "TemplateFamily",
    "TemplateProbe",
    "default_assistant_message",
    "rendered_arguments",
]


@dataclass(frozen=True, slots=True)
class TemplateProbe:
    """A template and what it renders for :data:`PROBE_MESSAGES` (tools, generation prompt)."""

    template: str
    """The chat template text."""
    rendered: str | None
    """The probe conversation rendered with :data:`PROBE_TOOLS`; None when it failed."""
    error: str | None = None
    """Why the probe did not render (None when it did)."""

    def renders(self, *fragments: str) -> bool:
        """True when the probe rendered and its text holds every fragment."""
        return self.rendered is not None and all(f in self.rendered for f in fragments)

    def mentions(self, *fragments: str) -> bool:
        """True when the template text holds every fragment."""
        return all(f in self.template for f in fragments)


@dataclass(frozen=True, slots=True)
class CallIdRequest:
    """What a family's :attr:`TemplateFamily.call_id` rule may base a call's id on."""

    name: str
    """The called tool's name."""
    index: int
    """Position of the call within its turn (0-based)."""
    call_number: int
    """Calls made earlier in the trajectory (so ids can be unique across turns)."""
    parsed_id: str
    """The id the parser gave the call (the model's own id, when the format has one)."""
    model_wrote_id: bool
    """Whether ``parsed_id`` comes from the model's text (False: the parser made it up)."""


AssistantMessageRule = Callable[
    ["str", "ParsedTurn", "TemplateFamily", Sequence[str]], dict[str, Any]
]
"""``(raw_text, parsed, family, call_ids) -> message``: a family's own message builder."""


@dataclass(frozen=True, slots=True)
class TemplateFamily:
    """The facts about one model family that token deltas, parsing and re-rendering need."""

    name: str
    """Registry name, e.g. ``"qwen25"``; also what ``--family`` takes."""
    stop_tokens: tuple[str, ...]
    """End-of-turn tokens the model emits, primary first. Each must be a single token."""
    boundary: str
    """Text the template writes right after the stop token that the model never emits."""
    generation_prompt: str
    """What ``add_generation_prompt=True`` appends (documentation and sanity checks)."""
    tool_parser: str
    """Name of the default tool-call parser for this family (see ``get_tool_parser``)."""
    rewrites_history: bool = False
    """True when re-rendering changes earlier turns (so a fresh render is not prefix-stable)."""
    history_normalizer: Callable[[str], str] | None = None
    """Maps a rendered text to a form in which the family's documented re-render
    differences vanish, so ``check_drift`` reports them as ``history_rewrite``."""
    description: str = ""
    """One line for docs and error messages."""
    detect: Callable[[TemplateProbe], bool] | None = None
    """True when a template belongs to this family, judged by what it renders for the probe
    conversation (else by its text). None: never detected, only chosen by name."""
    detect_priority: int = 0
    """Families with a higher priority are tried first (specific formats before generic)."""
    stop_opens_next_turn: bool = False
    """The model stops at a token the template writes as the *start* of the next turn
    (GLM-4.5's ``<|observation|>``): the delta starts right after it."""
    delta_after_history: bool = False
    """The delta follows the conversation rendered *as history* (with the generation prompt,
    then cut off) instead of the last stop token: for templates that end the last assistant
    turn another way once a turn follows (gpt-oss: ``<|return|>``, then ``<|end|>``)."""
    max_calls_per_turn: int | None = None
    """Most calls the official template renders in one assistant turn (Llama 3.1/3.2: 1).
    A turn with more is a counted parse error; nothing runs and the model is told."""
    arguments_as: Literal["object", "json"] = "object"
    """How the template reads ``tool_calls[].function.arguments``: a mapping it serialises
    itself, or a JSON string it prints as it is. The family's usual form: a
    :class:`~toolrollout.chat.ChatFormat` takes the other one when only that renders a probe
    call's JSON once (templates of one family differ)."""
    think_tags: tuple[str, str] | None = None
    """The reasoning block's delimiters, e.g. ``("<think>", "</think>")``."""
    reasoning_field: str | None = None
    """Message key the template reads the reasoning from (``reasoning_content``,
    ``thinking``); None: the family has no separate reasoning."""
    call_id: Callable[[CallIdRequest], str] | None = None
    """Makes a call's id where the template needs a particular form (Mistral: nine
    alphanumerics; Kimi-K2: ``functions.<name>:<n>``). None: the parser's id."""
    assistant_message: AssistantMessageRule | None = None
    """A family's own way to turn a model turn into its assistant message (harmony
    channels). None: :func:`default_assistant_message`."""
    tools_fallback: Callable[[Sequence[Mapping[str, Any]]], str] | None = None
    """For templates that ignore ``tools`` (Qwen2.5-VL): the text that presents the tool
    schemas, appended to the system message (one is added when there is none)."""
    drift_from_raw_text: bool = True
    """Whether the drift check renders assistant turns from the model's raw text (True) or
    from the structured message (False, where raw text is not valid content, e.g. harmony)."""
    vision: bool = False
    """A vision-language family (image placeholders in user and tool turns)."""
    parallel_calls: bool = True
    """Whether the format allows several calls in one assistant turn (documentation)."""
    feedback_role: Literal["tool", "user"] = "tool"
    """The role of the message that tells the model a call was malformed. ``"user"``
    (Mistral, whose templates need call ids and alternating turns): a turn with a malformed
    call then runs none of its calls, and one user message lists the errors."""

    def make_call_ids(self, parsed: ParsedTurn, call_number: int) -> list[str]:
        """The ids of a turn's calls, by :attr:`call_id` where the family has a rule."""
        ids: list[str] = []
        for index, call in enumerate(parsed.tool_calls):
            if self.call_id is None:
                ids.append(call.id)
                continue
            request = CallIdRequest(
                name=call.name,
                index=index,
                call_number=call_number + index,
                parsed_id=call.id,
                model_wrote_id=not call.id.startswith("call_"),
            )
            ids.append(self.call_id(request))
        return ids

    def build_assistant_message(
        self, text: str, parsed: ParsedTurn, call_ids: Sequence[str]
    ) -> dict[str, Any]:
        """The assistant message of one model turn, in the form this family's template reads."""
        rule = self.assistant_message or default_assistant_message
        return rule(text, parsed, self, call_ids)


def default_assistant_message(
    text: str, parsed: ParsedTurn, family: TemplateFamily, call_ids: Sequence[str]
) -> dict[str, Any]:
    """Content, reasoning (in the family's field) and tool calls, plus ``raw_content``.

    A turn with a malformed call keeps the model's whole text as its content: structured
    ``tool_calls`` could not render back to the tokens it was trained on.
    """
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.errors:
        message["content"] = text
    else:
        if family.reasoning_field is not None and parsed.reasoning is not None:
            message[family.reasoning_field] = parsed.reasoning
        if parsed.tool_calls:
            message["tool_calls"] = [
                call_entry(call_id, call.name, rendered_arguments(call.arguments, family))
                for call, call_id in zip(parsed.tool_calls, call_ids, strict=True)
            ]
    message["raw_content"] = text
    return message


def rendered_arguments(arguments: Mapping[str, Any], family: TemplateFamily) -> Any:
    """A call's arguments in the form the family's template reads (:attr:`arguments_as`)."""
    if family.arguments_as == "json":
        return json.dumps(arguments, ensure_ascii=False)
    return dict(arguments)


PROBE_TOOLS: tuple[dict[str, Any], ...] = (
    {
        "type": "function",
        "function": {
            "name": "probe_tool",
            "description": "A probe.",
            "parameters": {
                "type": "object",
                "properties": {"x": {"type": "string", "description": "A value."}},
                "required": ["x"],
            },
        },
    },
)
"""The tool schema the detection probe renders."""

PROBE_MESSAGES: tuple[dict[str, Any], ...] = (
    {"role": "system", "content": "You are a probe."},
    {"role": "user", "content": "Call the probe."},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "pRobe0001",  # nine alphanumerics: the strictest id rule (Mistral)
                "type": "function",
                "function": {"name": "probe_tool", "arguments": {"x": "1"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "pRobe0001", "name": "probe_tool", "content": "probe result"},
)
"""A conversation with one tool call and one tool result, rendered to detect a family."""
