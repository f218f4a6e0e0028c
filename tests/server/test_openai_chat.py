"""``/v1/chat/completions`` on the embedded server: OpenAI shapes, tool calls parsed.

The shipped demo model (a real tool-calling model) answers greedily, so the first turn
is a calculator call and, given the calculator's real result, the second is the answer.
Shapes follow SGLang's ``serving_chat.py``: ``finish_reason`` ``"tool_calls"``, call ids
``call_<24 hex>``, arguments as a JSON string.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from toolrollout.apps.demo import DEMO_MODEL_PATH, load_demo_prompts
from toolrollout.apps.server import create_app
from toolrollout.engines.embedded import EmbeddedEngine
from toolrollout.tools.calculator import CALCULATOR_TOOL, calculator


@pytest.fixture(scope="module")
def engine() -> Iterator[EmbeddedEngine]:
    eng = EmbeddedEngine(DEMO_MODEL_PATH, max_batch_size=4, num_threads=1)
    asyncio.run(eng.start())
    yield eng
    asyncio.run(eng.aclose())


@pytest.fixture
async def client(engine: EmbeddedEngine) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(engine, served_model_name="demo"))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c


async def test_tool_call_then_answer(client: httpx.AsyncClient) -> None:
    row = load_demo_prompts()[0]
    body = {
        "model": "demo",
        "messages": row["messages"],
        "tools": [CALCULATOR_TOOL],
        "temperature": 0.0,
        "max_tokens": 64,
    }
    first = await client.post("/v1/chat/completions", json=body)
    assert first.status_code == 200
    data = first.json()
    assert data["object"] == "chat.completion" and data["model"] == "demo"
    choice = data["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["matched_stop"] is None
    message = choice["message"]
    assert message["role"] == "assistant"
    (call,) = message["tool_calls"]
    assert re.fullmatch(r"call_[0-9a-f]{24}", call["id"])
    assert call["type"] == "function" and call["function"]["name"] == "calculator"
    arguments = json.loads(call["function"]["arguments"])  # a JSON string, as OpenAI sends
    assert set(arguments) == {"expression"}
    usage = data["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["completion_tokens"] > 0

    result = calculator(arguments["expression"])
    body["messages"] = [
        *row["messages"],
        message,
        {"role": "tool", "tool_call_id": call["id"], "content": result},
    ]
    second = (await client.post("/v1/chat/completions", json=body)).json()["choices"][0]
    assert second["finish_reason"] == "stop"
    assert second["message"]["tool_calls"] is None
    assert result in second["message"]["content"]


async def test_without_tools_the_text_is_returned_unparsed(client: httpx.AsyncClient) -> None:
    row = load_demo_prompts()[0]
    body = {"messages": row["messages"], "temperature": 0.0, "max_tokens": 8}
    data = (await client.post("/v1/chat/completions", json=body)).json()
    choice = data["choices"][0]
    assert choice["message"]["tool_calls"] is None
    assert choice["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}], "stream": True}, "stream"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n=2"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
    ],
)
async def test_bad_requests_get_one_line_400s(
    client: httpx.AsyncClient, body: dict[str, object], fragment: str
) -> None:
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert fragment in message and "\n" not in message


async def test_malformed_json_is_a_400(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert "JSON" in response.json()["error"]["message"]
