"""Stateful tools outside the loop: the session, verl tools per trajectory, row kwargs."""

from __future__ import annotations

from typing import Any, ClassVar

from toolrollout.tools import (
    ToolCallRequest,
    ToolContext,
    ToolExecutor,
    ToolSession,
    VerlToolAdapter,
    tool_kwargs,
)


class Response:
    def __init__(self, text: str) -> None:
        self.text = text


class VerlCounter:
    """Shaped like verl's BaseTool, with calc_reward; counts calls per instance."""

    events: ClassVar[list[tuple[str, str, Any]]] = []

    def __init__(self, config: dict[str, Any], tool_schema: Any) -> None:
        self.name = "count"
        self.state: dict[str, int] = {}

    def get_openai_tool_schema(self) -> Any:
        return {"type": "function", "function": {"name": "count", "parameters": {}}}

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, Any]:
        assert instance_id is not None
        self.events.append(("create", instance_id, kwargs))
        self.state[instance_id] = int(kwargs["create_kwargs"].get("start", 0))
        return instance_id, Response("")

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> Any:
        self.events.append(("execute", instance_id, kwargs))
        self.state[instance_id] += 1
        return Response(str(self.state[instance_id])), None, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return float(self.state[instance_id])

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self.events.append(("release", instance_id, kwargs))
        del self.state[instance_id]


async def test_verl_tool_keeps_one_instance_per_trajectory() -> None:
    VerlCounter.events = []
    tool = VerlToolAdapter.build(VerlCounter, {}, None)
    metadata = {
        "extra_info": {
            "tools_kwargs": {
                "count": {"create_kwargs": {"start": 10}, "execute_kwargs": {"step": 1}}
            }
        }
    }
    session = ToolSession("traj-7", metadata)
    context = ToolContext(metadata=metadata, ground_truth="x", session=session)
    executor = ToolExecutor([tool])
    await session.create_declared([tool], context)
    for expected in ("11", "12"):
        [result] = await executor.run_calls([ToolCallRequest("count", {})], context)
        assert result.text == expected, result
    assert await session.calc_rewards() == {"count": 12.0}
    await session.release_all()
    await session.release_all()  # idempotent: each instance is released once
    # verl's convention: create(instance_id, create_kwargs=...); the row's ground truth is a
    # default, execute_kwargs are keyword arguments.
    assert VerlCounter.events == [
        ("create", "traj-7", {"create_kwargs": {"start": 10, "ground_truth": "x"}}),
        ("execute", "traj-7", {"step": 1}),
        ("execute", "traj-7", {"step": 1}),
        ("release", "traj-7", {}),
    ]


async def test_without_a_session_each_call_gets_its_own_instance() -> None:
    VerlCounter.events = []
    tool = VerlToolAdapter.build(VerlCounter, {}, None)
    executor = ToolExecutor([tool])
    for _ in range(2):
        [result] = await executor.run_calls([ToolCallRequest("count", {})], ToolContext())
        assert result.text == "1"
    assert [e[0] for e in VerlCounter.events] == ["create", "execute", "release"] * 2


def test_tool_kwargs_reads_both_places_and_parquet_nulls() -> None:
    top = {"tools_kwargs": {"a": {"create_kwargs": {"k": 1}}}}
    nested = {"extra_info": {"tools_kwargs": {"a": {"create_kwargs": {"k": 2}}, "b": None}}}
    assert tool_kwargs(top, "a", "create_kwargs") == {"k": 1}
    assert tool_kwargs(nested, "a", "create_kwargs") == {"k": 2}
    assert tool_kwargs(nested, "b", "create_kwargs") == {}
    assert tool_kwargs(nested, "a", "release_kwargs") == {}
