"""Token-in/token-out transcripts: prompt rendering and tool-turn token deltas.

Decoding the model's ids and tokenizing the text again is not a bijection (BPE may merge
differently, the model may have sampled a non-canonical split, templates rewrite history),
and any difference misaligns the engine's logprobs. So the prompt is tokenized **once**,
each model turn is appended **verbatim** from the engine's ids, and each tool turn as the
ids of a **text suffix**: the template is rendered with and without the new messages, and
only the text after the model's stop token is tokenized.

That suffix tokenizes as a full tokenization would tokenize that span, because it starts
right after the stop token, a special token at which the tokenizer always splits (checked
when a :class:`ChatFormat` is built). It is found by counting stop tokens rather than by
comparing the renders as a whole, so templates that render the last assistant turn
differently once it is no longer last (Qwen3's empty ``<think></think>``) still work, and
the real conversation is rendered so that tool turns that depend on earlier messages (call
ids, merged tool turns) are honoured.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jinja2 import TemplateError

if TYPE_CHECKING:  # transformers is heavy; only its type is needed here
    from transformers import PreTrainedTokenizerBase

from .._exceptions import TokenizationError, UserError
from ._probe import probe_template, with_rendered_arguments
from ._tokenize import decode, encode_many, plain_backend
from .families import TemplateFamily, detect_template_family, get_template_family
from .families._family import TemplateProbe

__all__ = ["ChatFormat", "Message"]

Message = Mapping[str, Any]
"""An OpenAI-style chat message: ``{"role": ..., "content": ..., "tool_calls": ...}``."""


_RESERVED_KWARGS = frozenset(
    {"add_generation_prompt", "chat_template", "continue_final_message", "tokenize", "tools"}
)


class ChatFormat:
    """Renders prompts and tool-turn token deltas for one tokenizer, template and tool set.

    It holds no per-trajectory state (only a shared verdict on windowed deltas), so one instance
    can serve every concurrent rollout that shares the model and the tools.
    """

    __slots__ = (
        "_family",
        "_stop_pattern",
        "_stop_token_ids",
        "_template",
        "_template_kwargs",
        "_tokenizer",
        "_tools",
        "_window_state",
    )

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        family: str | TemplateFamily | None = None,
        chat_template: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        windowed_deltas: bool = True,
    ) -> None:
        """Bind a tokenizer to a template family.

        Args:
            tokenizer: a Hugging Face tokenizer with a chat template (or pass one).
            tools: OpenAI-style tool schemas, rendered into every prompt.
            family: family name, a :class:`TemplateFamily`, or ``None`` to detect it from
                what the template renders for a probe conversation.
            chat_template: overrides the tokenizer's own template.
            template_kwargs: extra template variables, e.g. ``{"enable_thinking": False}``;
                they are passed to every render so deltas and prompts agree.
            windowed_deltas: render each tool-turn delta from a short window (system,
                stand-in user, last assistant turn) instead of the whole conversation, so
                its cost does not grow with the conversation. The first few windowed deltas
                are compared with full renders; on any difference the format falls back to
                full renders for good.
        """
        self._tokenizer = tokenizer
        self._tools: tuple[dict[str, Any], ...] = tuple(dict(tool) for tool in tools or ())
        self._template_kwargs: dict[str, Any] = dict(template_kwargs or {})
        reserved = sorted(_RESERVED_KWARGS.intersection(self._template_kwargs))
        if reserved:
            raise UserError(
                f"template_kwargs may not set {', '.join(reserved)}: ChatFormat controls them"
            )
        self._template = self._resolve_template(tokenizer, chat_template)
        if isinstance(family, TemplateFamily):
            chosen = family
        elif isinstance(family, str):
            chosen = get_template_family(family)
        else:
            chosen = detect_template_family(
                self.probe(), source=f"the chat template of {_tokenizer_name(tokenizer)}"
            )
        self._family = with_rendered_arguments(
            chosen, self._tokenizer, self._template, self._template_kwargs
        )
        self._stop_token_ids = self._check_stop_tokens()
        self._stop_pattern = re.compile(
            "|".join(re.escape(token) for token in self._family.stop_tokens)
        )
        # Windowed deltas are cross-checked against full renders for the first few turns;
        # [checks left, enabled]. Shared by every trajectory on purpose (one verdict per
        # template), and safe without a lock on one event loop.
        self._window_state: list[int] = [_WINDOW_CHECKS, int(windowed_deltas)]

    # -- public properties ------------------------------------------------------------

    @property
    def family(self) -> TemplateFamily:
        """The template family whose boundary rule this format applies."""
        return self._family

    @property
    def windowed_deltas(self) -> bool:
        """Whether deltas are rendered from a short window (see ``__init__``)."""
        return bool(self._window_state[1])

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The tokenizer every render is tokenized with."""
        return self._tokenizer

    @property
    def tools(self) -> tuple[dict[str, Any], ...]:
        """The tool schemas rendered into the prompt."""
        return self._tools

    @property
    def template_kwargs(self) -> dict[str, Any]:
        """Extra template variables passed to every render (a copy)."""
        return dict(self._template_kwargs)

    @property
    def chat_template(self) -> str:
        """The template text in use."""
        return self._template

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Ids of the family's end-of-turn tokens present in this tokenizer, primary first."""
        return self._stop_token_ids

    # -- rendering ----------------------------------------------------------------------

    def probe(self) -> TemplateProbe:
        """What the template renders for the detection probe (see :class:`TemplateProbe`)."""
        return probe_template(self._tokenizer, self._template, self._template_kwargs)

    def presented_messages(self, messages: Sequence[Message]) -> list[dict[str, Any]]:
        """``messages`` as the template must see them: for a family whose template ignores
        ``tools`` (:attr:`TemplateFamily.tools_fallback`), with the tool schemas in the
        system message. Idempotent, so messages that already hold them are left alone."""
        conversation = [dict(message) for message in messages]
        fallback = self._family.tools_fallback
        if fallback is not None and self._tools:
            conversation = _with_tools_in_system(conversation, fallback(self._tools))
        return conversation

    def render_text(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
        """Render ``messages`` (as :meth:`presented_messages`) with the chat template, tools
        and template kwargs."""
        if not messages:
            raise UserError("cannot render an empty conversation")
        conversation = self.presented_messages(messages)
        tools: list[dict[Any, Any] | Callable[..., Any]] | None = list(self._tools) or None
        if self._family.tools_fallback is not None:
            tools = None  # presented in the system message instead
        try:
            rendered = self._tokenizer.apply_chat_template(
                conversation,
                tools=tools,
                chat_template=self._template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **self._template_kwargs,
            )
        except TemplateError as exc:
            raise TokenizationError(f"the chat template failed to render: {exc}") from exc
        if not isinstance(rendered, str):
            raise TokenizationError(
                f"apply_chat_template returned {type(rendered).__name__}, expected text"
            )
        return rendered

    @property
    def encodes_without_the_gil(self) -> bool:
        """Whether :meth:`encode` calls the Rust backend directly, which releases the GIL
        while it works and keeps no per-call state: safe to call from a worker thread."""
        return plain_backend(self._tokenizer) is not None

    def encode(self, text: str) -> list[int]:
        """Tokenize rendered template text (no BOS/EOS added: the template writes them)."""
        return self.encode_many((text,))[0]

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        """Tokenize several rendered texts in one call (as :meth:`encode` does each), the
        fast way when it gives the same ids (:mod:`toolrollout.chat._tokenize`)."""
        return encode_many(self._tokenizer, texts)

    def decode(self, ids: Sequence[int]) -> str:
        """Decode ids exactly, keeping special tokens (the fast way when it gives the
        same text, :mod:`toolrollout.chat._tokenize`)."""
        return decode(self._tokenizer, ids)

    def render_prompt(self, messages: Sequence[Message]) -> list[int]:
        """The prompt ids that start the transcript: the render with the generation prompt."""
        return self.encode(self.render_text(messages, add_generation_prompt=True))

    def tool_turn_delta(
        self, messages_before: Sequence[Message], tool_messages: Sequence[Message]
    ) -> list[int]:
        """The ids to append after a model turn's verbatim output ids (loss mask 0).

        ``messages_before`` ends with the assistant turn the model just produced (its ids
        end with the stop token); ``tool_messages`` are the new non-assistant messages. The
        result is the family's boundary, the new turn(s) as the template renders them, then
        the next generation prompt.
        """
        return self.encode(self.tool_turn_delta_text(messages_before, tool_messages))

    def tool_turn_delta_text(
        self, messages_before: Sequence[Message], tool_messages: Sequence[Message]
    ) -> str:
        """The text that :meth:`tool_turn_delta` tokenizes (for logging and debugging)."""
        if not messages_before or messages_before[-1].get("role") != "assistant":
            raise UserError(
                "messages_before must end with the assistant turn whose output ids were "
                "just appended to the transcript"
            )
        if not tool_messages:
            raise UserError("tool_messages is empty: there is no turn to append")
        if any(message.get("role") == "assistant" for message in tool_messages):
            raise UserError(
                "tool_messages must not contain assistant turns; append model output ids "
                "verbatim instead"
            )
        window = self._window(messages_before)
        checks_left, enabled = self._window_state
        if window is None or not enabled:
            return self._delta_from(messages_before, tool_messages)
        try:
            windowed = self._delta_from(window, tool_messages)
        except TokenizationError:
            windowed = None
        if checks_left <= 0 and windowed is not None:
            return windowed
        full = self._delta_from(messages_before, tool_messages)
        if windowed == full:
            self._window_state[0] = checks_left - 1
        else:
            self._window_state[1] = 0  # this template depends on more history: render it all
        return full

    def _window(self, messages_before: Sequence[Message]) -> list[Message] | None:
        """``[system?, user, last assistant turn]``: a delta depends on how the template
        closes the last assistant turn, not on the turns before it, and rendering only these
        keeps a turn's cost flat. ``None`` when it would not be shorter."""
        head = list(messages_before[:1]) if messages_before[0].get("role") == "system" else []
        window = [*head, {"role": "user", "content": "."}, messages_before[-1]]
        return window if len(window) < len(messages_before) else None

    def _delta_from(
        self, messages_before: Sequence[Message], tool_messages: Sequence[Message]
    ) -> str:
        """The delta text after ``messages_before``'s last stop token, checked for shape."""
        if self._family.delta_after_history:
            return self._delta_after_history(messages_before, tool_messages)
        without = self.render_text(messages_before, add_generation_prompt=False)
        with_new = self.render_text([*messages_before, *tool_messages], add_generation_prompt=True)
        if self._family.stop_opens_next_turn:
            return self._delta_after_opener(without, with_new)
        stops = list(self._stop_pattern.finditer(without))
        if not stops:
            raise TokenizationError(
                f"the rendered conversation contains no stop token "
                f"({', '.join(self._family.stop_tokens)}); is family "
                f"{self._family.name!r} right for this template?"
            )
        boundary = without[stops[-1].end() :]
        if boundary != self._family.boundary:
            raise TokenizationError(
                f"the template writes {boundary!r} after the model's stop token, but family "
                f"{self._family.name!r} documents {self._family.boundary!r}; configure the "
                "right family for this template"
            )
        anchor = _nth_match_end(self._stop_pattern, with_new, len(stops))
        if anchor is None:
            raise TokenizationError(
                "adding the tool messages removed an earlier stop token from the render; "
                "this template cannot be extended turn by turn"
            )
        suffix = with_new[anchor:]
        if not suffix.startswith(boundary):
            raise TokenizationError(
                f"the rendered tool turn does not start with the boundary {boundary!r}: "
                f"{suffix[:80]!r}"
            )
        return suffix

    def _delta_after_history(
        self, messages_before: Sequence[Message], tool_messages: Sequence[Message]
    ) -> str:
        """The delta after the conversation as the template renders it once a turn follows.

        That render is the one with the generation prompt, less the prompt; the render with
        the new messages must extend it. The model's own turn end (gpt-oss's ``<|return|>``
        where history has ``<|end|>``) stays in the transcript: a documented rewrite.
        """
        history = self.render_text(messages_before, add_generation_prompt=True)
        prompt = self._family.generation_prompt
        with_new = self.render_text([*messages_before, *tool_messages], add_generation_prompt=True)
        prefix = history.removesuffix(prompt)
        if prefix == history or not with_new.startswith(prefix):
            raise TokenizationError(
                f"family {self._family.name!r} expects the render with the new messages to "
                f"extend the conversation rendered as history (ending {prompt!r}), but it "
                "does not; configure the right family for this template"
            )
        return with_new[len(prefix) :]

    def _delta_after_opener(self, without: str, with_new: str) -> str:
        """The delta of a family whose stop token opens the next turn (GLM-4.5): what follows
        that token, which the render with the new messages writes where the conversation
        ended. Where a new user turn rewrote earlier turns, that place is found under the
        family's documented rewrite (:meth:`_rewritten_end`).
        """
        end: int | None = len(without)
        if not with_new.startswith(without):
            end = self._rewritten_end(without, with_new)
        opener = None if end is None else self._stop_pattern.match(with_new, end)
        if opener is None:
            raise TokenizationError(
                f"family {self._family.name!r} expects the new turn to start with one of "
                f"{', '.join(self._family.stop_tokens)} right where the conversation ended, "
                f"but the template wrote {with_new[len(without) : len(without) + 40]!r}; "
                "configure the right family for this template"
            )
        return with_new[opener.end() :]

    def _rewritten_end(self, without: str, with_new: str) -> int | None:
        """Where the conversation ends in ``with_new`` when the new messages rewrote earlier
        turns by the family's documented rewrite (its ``history_normalizer``); None when no
        documented rewrite explains the difference."""
        normalize = self._family.history_normalizer
        if normalize is None or not self._family.rewrites_history:
            return None
        before, after = normalize(without), normalize(with_new)
        if not after.startswith(before):
            return None
        new_part = after[len(before) :]
        return len(with_new) - len(new_part) if with_new.endswith(new_part) else None

    # -- model output helpers -------------------------------------------------------------

    def ends_with_stop(self, ids: Sequence[int]) -> bool:
        """Whether a model turn ended with an end-of-turn token (so a delta may follow)."""
        return bool(ids) and ids[-1] in self._stop_token_ids

    def model_text(self, output_ids: Sequence[int]) -> str:
        """A model turn's raw text without its trailing stop token: what the parser reads and
        ``check_drift`` takes as ``model_texts``."""
        return self.strip_stop(self.decode(output_ids))

    def strip_stop(self, text: str) -> str:
        """Remove one trailing end-of-turn token string from ``text``, if present."""
        for token in self._family.stop_tokens:
            if text.endswith(token):
                return text[: -len(token)]
        return text

    # -- construction helpers -------------------------------------------------------------

    def _resolve_template(
        self, tokenizer: PreTrainedTokenizerBase, chat_template: str | None
    ) -> str:
        if chat_template is not None:
            return chat_template
        try:
            template = tokenizer.get_chat_template(None, list(self._tools) or None)
        except ValueError:  # transformers' way to say there is none
            template = None
        if not isinstance(template, str) or not template:
            raise UserError("the tokenizer has no chat template; pass chat_template= explicitly")
        return template

    def _check_stop_tokens(self) -> tuple[int, ...]:
        """Map stop tokens to ids; the primary one must be a single, splitting token."""
        ids: list[int] = []
        for position, token in enumerate(self._family.stop_tokens):
            encoded = self.encode(token)
            # The token must also split text on both sides, or the suffix would not
            # tokenize like the full sequence does.
            probe = self.encode(f"a{token}a")
            if len(encoded) == 1 and encoded[0] in probe:
                ids.append(encoded[0])
            elif position == 0:
                raise TokenizationError(
                    f"{token!r} is not a single special token of this tokenizer, so family "
                    f"{self._family.name!r} does not fit it (add the token, or pick the "
                    "right family)"
                )
        return tuple(ids)


_WINDOW_CHECKS = 4
"""Windowed deltas compared with full renders before the window is trusted alone."""


def _tokenizer_name(tokenizer: Any) -> str:
    name = getattr(tokenizer, "name_or_path", "") or ""
    return repr(name) if name else "this tokenizer"


def _with_tools_in_system(
    conversation: list[dict[str, Any]], tools_text: str
) -> list[dict[str, Any]]:
    """Append ``tools_text`` to the system message (adding one if there is none).

    A system message that already ends with ``tools_text`` (messages of a finished
    trajectory, which hold it) is left as it is.
    """
    if conversation and conversation[0].get("role") == "system":
        system = dict(conversation[0])
        content = system.get("content")
        last = content[-1] if isinstance(content, list) and content else None
        if (isinstance(content, str) and content.endswith(tools_text)) or (
            isinstance(last, Mapping) and str(last.get("text", "")).endswith(tools_text)
        ):
            return conversation
        if isinstance(content, str):
            system["content"] = f"{content}\n\n{tools_text}" if content else tools_text
        elif isinstance(content, list):
            system["content"] = [*content, {"type": "text", "text": f"\n\n{tools_text}"}]
        else:
            system["content"] = tools_text
        return [system, *conversation[1:]]
    return [{"role": "system", "content": tools_text}, *conversation]


def _nth_match_end(pattern: re.Pattern[str], text: str, n: int) -> int | None:
    """End offset of the ``n``-th (1-based) match of ``pattern`` in ``text``."""
    for count, match in enumerate(pattern.finditer(text), start=1):
        if count == n:
            return match.end()
    return None
