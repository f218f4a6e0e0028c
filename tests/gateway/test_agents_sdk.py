"""An ``openai-agents`` Agent with a function tool runs against the gateway, unmodified but
for its client's base URL, through both of the framework's OpenAI models: the Chat
Completions one and the Responses one. The framework runs the tool, keeps the history and
replays it; the gateway records each run as one token-exact segment."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from ._served import (
    MODEL,
    PROMPTS,
    SYSTEM,
    Served,
    served_fixture,  # noqa: F401  (the fixture "served")
)
from ._served import run_tool as _run_tool

pytestmark = pytest.mark.slow

RAN: list[str] = []


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Args:
        expression: Arithmetic with + - * / // % ** and parentheses, e.g. 3 * (4 + 5)
    """
    RAN.append(expression)
    return _run_tool("calculator", {"expression": expression})


@pytest.fixture(autouse=True)
def no_tracing() -> Iterator[None]:
    """The framework exports traces to OpenAI by default; nothing leaves this machine."""
    set_tracing_disabled(True)
    RAN.clear()
    yield
    set_tracing_disabled(False)


@pytest.mark.parametrize("api", ["chat_completions", "responses", "responses_streamed"])
async def test_an_agent_with_a_function_tool_is_recorded(served: Served, api: str) -> None:
    session = served.session()
    client = openai.AsyncOpenAI(
        base_url=f"{served.url}/v1",
        api_key="harness-key",
        default_headers={"X-Toolrollout-Session": session},
        max_retries=0,
    )
    model: Any
    if api.startswith("responses"):
        model = OpenAIResponsesModel(model=MODEL, openai_client=client)
    else:
        model = OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
    agent = Agent(
        name="calculator agent",
        instructions=SYSTEM,
        tools=[calculator],
        model=model,
        model_settings=ModelSettings(temperature=0, max_tokens=96),
    )
    result: Any
    if api == "responses_streamed":  # the framework reads the Responses event stream
        result = Runner.run_streamed(agent, PROMPTS[0], max_turns=4)
        kinds = {event.type async for event in result.stream_events()}
        assert "raw_response_event" in kinds
    else:
        result = await Runner.run(agent, PROMPTS[0], max_turns=4)
    assert RAN  # the framework ran the harness's tool (what the tiny model asked for)
    await client.close()
    [row] = served.close(session)
    assert row.num_turns == len(RAN) + 1 and row.num_tool_calls == len(RAN)
    outputs = [_run_tool("calculator", {"expression": e}) for e in RAN]
    assert [(m["role"], m["content"]) for m in row.messages if m["role"] != "assistant"] == [
        ("system", SYSTEM), ("user", PROMPTS[0]), *(("tool", out) for out in outputs),
    ]  # fmt: skip
    assert row.messages[-1]["content"] == result.final_output
    calls = [c["function"]["arguments"] for m in row.messages for c in m.get("tool_calls", ())]
    # recorded in the family's form: the demo (Qwen2.5) template takes an object
    assert [a if isinstance(a, dict) else json.loads(a) for a in calls] == [
        {"expression": e} for e in RAN
    ]
