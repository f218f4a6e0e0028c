"""What a gateway request must be: its messages, images and ``tool_choice``, checked.

Every check answers a bad request with a one-line :class:`GatewayError` (``invalid_request``,
status 400) that names the offending field, before anything is planned or generated; the
answer's ``tool_choice`` is checked here too (:func:`check_tool_choice`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from toolrollout.chat import ChatFormat

from ._types import ChatChoice, ChatRequest, GatewayError, invalid

__all__ = [
    "check_tool_choice",
    "checked_messages",
    "forced_ids",
    "image_keys",
    "no_vision",
    "opens_thinking",
    "required_tool",
    "reward_value",
]

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


def checked_messages(request: ChatRequest) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The request's messages without empty fields, image parts as ``{"type": "image",
    "sha256"}`` (the template renders a placeholder; the digest tells images apart when a
    request is matched against a transcript), and the images' data URLs by digest; a
    one-line error for a bad message."""
    if not request.messages:
        raise invalid("messages must not be empty")
    out: list[dict[str, Any]] = []
    urls: dict[str, str] = {}
    for i, message in enumerate(request.messages):
        if not isinstance(message, Mapping) or message.get("role") not in _ROLES:
            raise invalid(f"messages[{i}]: role must be one of {', '.join(sorted(_ROLES))}")
        cleaned = {k: v for k, v in message.items() if v is not None}
        if cleaned["role"] == "developer":
            cleaned["role"] = "system"
        if isinstance(cleaned.get("content"), list):
            cleaned["content"] = [
                _image_part(part, f"messages[{i}].content[{j}]", urls)
                for j, part in enumerate(cleaned["content"])
            ]
        out.append(cleaned)
    if out[-1]["role"] == "assistant":
        raise invalid(
            "the last message is an assistant turn; continuing a prefilled assistant "
            "message is not supported"
        )
    return out, urls


def _image_part(part: Any, where: str, urls: dict[str, str]) -> Any:
    """An ``image_url`` part as the template's image part; other parts unchanged."""
    if not isinstance(part, Mapping) or part.get("type") not in ("image_url", "image"):
        return part
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, Mapping) else image
    if part.get("type") == "image" and "sha256" in part:
        return part  # already canonical
    if not isinstance(url, str) or not url:
        raise invalid(f"{where}: an image part needs a URL")
    if not url.startswith("data:"):
        raise invalid(
            f"{where}: image URLs are not fetched (the gateway has no network access); send "
            "the image inline as a base64 data: URL"
        )
    key = hashlib.sha256(url.encode()).hexdigest()
    urls[key] = url
    return {"type": "image", "sha256": key}


def image_keys(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The digests of the image parts of ``messages``, in rendering order."""
    return [
        str(part["sha256"])
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if isinstance(part, Mapping) and part.get("type") == "image" and "sha256" in part
    ]


def no_vision() -> GatewayError:
    return invalid("this model takes no images (its folder has no image processor); send text")


def required_tool(request: ChatRequest) -> str | None:
    """What ``tool_choice`` demands: None (nothing), "" (some call) or a tool's name."""
    choice = request.tool_choice
    if choice is None or choice in ("auto", "none"):
        return None
    names = [str(t.get("function", {}).get("name", "")) for t in request.tools]
    if not names:
        raise invalid("tool_choice asks for a tool call but no tools were given")
    if choice == "required":
        return ""
    name = choice.get("function", {}).get("name") if isinstance(choice, Mapping) else None
    if not isinstance(name, str) or not name:
        raise invalid(
            f"tool_choice: {choice!r} is not supported (auto, none, required, a function)"
        )
    if name not in names:
        raise invalid(f"tool_choice names {name!r}, which is not in tools")
    return name


def forced_ids(chat: ChatFormat, prefix: str) -> tuple[int, ...]:
    """The ids of ``prefix`` that stay the same whatever follows it: a last token that
    would merge with the model's next characters (``": "`` + ``{"`` is one token ``' {"'``
    in Qwen's vocabulary) is left for the model, so the turn keeps the tokenization a
    fresh render of the call gives."""
    ids = chat.encode(prefix)
    keep = len(ids)
    for following in ('{"', "<", " ", "a", "\n", '"'):
        longer = chat.encode(prefix + following)
        same = 0
        while same < min(keep, len(longer)) and ids[same] == longer[same]:
            same += 1
        keep = same
    return tuple(ids[:keep])


def check_tool_choice(choices: Sequence[ChatChoice], required: str) -> None:
    """A forced call the model did not complete is an error, never plain text."""
    for choice in choices:
        names = [call.name for call in choice.tool_calls]
        if names and (not required or all(name == required for name in names)):
            continue
        wanted = f"a call to {required!r}" if required else "a tool call"
        got = f"calls to {names}" if names else f"no parseable call ({choice.content[:200]!r})"
        raise GatewayError(
            "tool_choice_unmet",
            f"tool_choice required {wanted}, but the model produced {got}",
            status=500,
        )


def opens_thinking(chat: ChatFormat, prompt: Sequence[int]) -> bool:
    """Whether the generation prompt ends inside an open ``<think>`` block."""
    return chat.decode(list(prompt[-8:])).rstrip().endswith("<think>")


def reward_value(reward: Any) -> float:
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise invalid(f"reward must be a number, got {reward!r}")
    return float(reward)
