"""Shared pieces of the gateway tests: the demo tokenizer (with its own template and with
Qwen3's official one), a scripted engine answering with chosen texts, and a harness that
sends messages back the way an OpenAI SDK user does (text and JSON-string arguments)."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import pytest
import uvicorn

from toolrollout.apps.demo import DEMO_MODEL_PATH
from toolrollout.apps.gateway import ChatResult, Gateway, GatewayConfig, build_app
from toolrollout.apps.gateway._types import ChatChoice
from toolrollout.chat import ChatFormat, check_drift
from toolrollout.engines import GenerateRequest
from toolrollout.rollout import Trajectory
from toolrollout.spec._policy import load_tokenizer
from toolrollout.testing import ScriptedEngine, ScriptedOutput

OFFICIAL = Path(__file__).parents[1] / "chat" / "templates" / "official"

TOOLS: tuple[dict[str, Any], ...] = (
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
)


@pytest.fixture(scope="session")
def demo_tokenizer() -> Any:
    return load_tokenizer(DEMO_MODEL_PATH)


@pytest.fixture(scope="session", params=["demo", "qwen3-official"])
def tokenizer(request: pytest.FixtureRequest) -> Any:
    """The demo tokenizer under its own template, and under Qwen3's official one."""
    tok = load_tokenizer(DEMO_MODEL_PATH)
    if request.param == "qwen3-official":
        tok.chat_template = (OFFICIAL / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    return tok


def call_text(expression: str) -> str:
    args = json.dumps({"expression": expression})
    return f'<tool_call>\n{{"name": "calculator", "arguments": {args}}}\n</tool_call>'


class Model:
    """A scripted engine answering with texts chosen per request, logprobs numbered."""

    def __init__(
        self,
        tokenizer: Any,
        answer: Callable[[GenerateRequest], str] | Sequence[str],
        *,
        delay: float = 0.0,
        token_delay: float = 0.0,
        context_length: int | None = None,
        numbered: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        counter = itertools.count()
        texts = iter(answer) if not callable(answer) else None
        self.outputs: dict[str, tuple[int, ...]] = {}

        def script(request: GenerateRequest) -> ScriptedOutput:
            text = answer(request) if callable(answer) else next(texts)  # type: ignore[arg-type]
            ids = tuple(tokenizer.encode(text + "<|im_end|>", add_special_tokens=False))
            start = next(counter) * 1000 if numbered else 0
            logprobs = [-(start + i + 1) / 10_000 for i in range(len(ids))]
            self.outputs[request.rid or ""] = ids
            return ScriptedOutput(ids, logprobs=logprobs, delay=delay, token_delay=token_delay)

        self.engine = ScriptedEngine(script, context_length=context_length, weight_version="v7")


def sent_back(choice: ChatChoice) -> dict[str, Any]:
    """The assistant message an OpenAI SDK user appends from a choice."""
    message: dict[str, Any] = {"role": "assistant", "content": choice.content or None}
    if choice.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in choice.tool_calls
        ]
    return message


def tool_results(result: ChatResult, answer: str = "42") -> list[dict[str, Any]]:
    return [
        {"role": "tool", "tool_call_id": call.id, "content": answer}
        for call in result.choices[0].tool_calls
    ]


def rebuilt(row: Trajectory, chat: ChatFormat) -> list[int]:
    """The family's rule applied to the row's final messages: the prompt rendered once,
    each model turn's ids, each run of other messages as the template delta after it."""
    messages = list(row.messages)
    forced = {o for o, _ in row.metrics.get("gateway", {}).get("forced_tokens", [])}
    turns: list[tuple[int, ...]] = []
    offset, prefix = 0, cast(tuple[int, ...], ())
    for span in row.spans:  # a model turn is its forced ids (tool_choice), then its own
        if span.kind == "model":
            turns.append((*prefix, *span.ids))
            prefix = ()
        elif offset in forced:
            prefix = span.ids
        offset += len(span.ids)
    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    first = assistants[len(assistants) - len(turns)]  # earlier ones came in the prompt
    ids = chat.render_prompt(messages[:first])
    model_turns = iter(turns)
    i = first
    while i < len(messages):
        ids.extend(next(model_turns))
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        if j > i + 1:
            ids.extend(chat.tool_turn_delta(messages[: i + 1], messages[i + 1 : j]))
        i = j
    return ids


def assert_token_exact(row: Trajectory, chat: ChatFormat) -> None:
    """The row's ids are its final messages under the family's rule, and a fresh render
    of them (up to the family's documented history rewrite, e.g. Qwen3's); masks and
    logprobs line up."""
    ids = [*row.prompt_ids, *row.response_ids]
    assert ids == rebuilt(row, chat)
    report = check_drift(ids, row.messages, chat_format=chat)
    rewrites = chat.family.name == "qwen3"
    assert report.matches or (rewrites and report.kind == "history_rewrite"), report
    assert row.metrics["drift_mismatches"] == 0  # the gateway's own check, the rollout's
    assert len(row.loss_mask) == len(row.response_ids) == len(row.rollout_logprobs)
    for span in row.spans:
        if span.kind == "model":
            assert all(lp < 0 for lp in span.logprobs)  # the engine's, kept
        else:
            assert set(span.logprobs) <= {0.0}


@asynccontextmanager
async def served(
    model: Model, config: GatewayConfig | None = None, *, vision: Any = None
) -> AsyncIterator[tuple[str, Gateway]]:
    """The gateway on a loopback port, in the test's event loop: (base URL, gateway)."""
    async with Gateway(model.engine, model.tokenizer, config=config, vision=vision) as gateway:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(build_app(gateway), log_level="warning"))
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            for _ in range(1000):
                if server.started:
                    break
                await asyncio.sleep(0.01)
            yield f"http://127.0.0.1:{port}", gateway
        finally:
            server.should_exit = True
            await serving
            sock.close()
