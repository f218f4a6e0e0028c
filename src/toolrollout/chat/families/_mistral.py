r"""Mistral: ``[INST]`` turns, ``[TOOL_CALLS]`` calls with nine-character ids, ``</s>`` stop.

One family covers Nemo 2407 and Small 3.1 2503 (a JSON list of calls after
``[TOOL_CALLS]``) and Small 3.2 2506 (``[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}``). The
model stops at ``</s>``; the template writes nothing after it and no generation prompt.

The templates refuse call ids that are not nine letters or digits, and conversations
whose user and assistant turns do not alternate. So a call keeps the id the model wrote
(the parser refuses malformed ones) or gets a nine-character one, and a turn with a
malformed call runs none of its calls and is answered by a user turn.

Documented rewrites: ``[AVAILABLE_TOOLS]`` moves to the last user turn; Nemo writes the
system message into the last user turn only; text before ``[TOOL_CALLS]`` is not
rendered; a call id the model did not write appears in the render; Small 3.x's default
system prompt holds today's date.
"""

from __future__ import annotations

import re

from ._family import CallIdRequest, TemplateFamily, TemplateProbe

__all__ = ["FAMILIES", "MISTRAL"]

_TOOLS_BLOCK = re.compile(r"\[AVAILABLE_TOOLS\].*?\[/AVAILABLE_TOOLS\]", re.DOTALL)
_INST_BLOCK = re.compile(r"\[INST\](.*?)\[/INST\]", re.DOTALL)
_TEXT_BEFORE_CALLS = re.compile(
    r"(\[/INST\]|\[/TOOL_RESULTS\])"
    r"(?:(?!\[INST\]|\[TOOL_RESULTS\]|</s>|\[TOOL_CALLS\]).)*?"
    r"(?=\[TOOL_CALLS\])",
    re.DOTALL,
)
_JSON_CALL_ID = re.compile(r', "id": "[A-Za-z0-9]{9}"\}')
_COMPACT_CALL_ID = re.compile(r"\[CALL_ID\][A-Za-z0-9]{9}(?=\[ARGS\])")
_TODAY = re.compile(r"The current date is \d{4}-\d{2}-\d{2}\.")


def _last_paragraph(match: re.Match[str]) -> str:
    """Nemo prepends ``system + "\n\n"`` to the last user turn: compare what follows."""
    return "[INST]" + match.group(1).rsplit("\n\n", 1)[-1] + "[/INST]"


def _mistral_rewrites(text: str) -> str:
    """Remove the differences the Mistral templates make between renders of one chat."""
    text = _TOOLS_BLOCK.sub("", text)
    if "[SYSTEM_PROMPT]" not in text:  # Nemo: the system message moves with the last user
        text = _INST_BLOCK.sub(_last_paragraph, text)
    text = _TEXT_BEFORE_CALLS.sub(r"\1", text)
    text = _JSON_CALL_ID.sub("}", text)
    text = _COMPACT_CALL_ID.sub("", text)
    return _TODAY.sub("The current date is (today).", text)


def _nine_alphanumerics(request: CallIdRequest) -> str:
    """The model's own id (the parser checked its form), else ``call`` and 5 digits."""
    if request.model_wrote_id:
        return request.parsed_id
    return f"call{request.call_number % 100_000:05d}"


def _is_mistral(probe: TemplateProbe) -> bool:
    return probe.renders("[INST]", "[TOOL_CALLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]")


MISTRAL = TemplateFamily(
    name="mistral",
    stop_tokens=("</s>",),
    boundary="",
    generation_prompt="",
    tool_parser="mistral",
    rewrites_history=True,
    history_normalizer=_mistral_rewrites,
    description="Mistral Nemo / Small 3.x: [INST] turns, [TOOL_CALLS] with 9-character "
    "call ids, [TOOL_RESULTS], strict user/assistant alternation.",
    detect=_is_mistral,
    call_id=_nine_alphanumerics,
    drift_from_raw_text=False,
    feedback_role="user",
)

FAMILIES: tuple[TemplateFamily, ...] = (MISTRAL,)
