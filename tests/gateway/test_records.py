"""Gateway sessions on disk: generate's schema and crash-safe shards, readable by the
trainer adapters as runner trajectories are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolrollout.apps.gateway import ChatRequest, Gateway, GatewayConfig
from toolrollout.exceptions import UserError
from toolrollout.integrations import to_verl_batch, trajectory_extras
from toolrollout.metrics import rollout_metrics
from toolrollout.rollout import TRAJECTORY_SCHEMA, read_rows, read_shards

from .conftest import TOOLS, Model, call_text, sent_back, tool_results


def answers(request: Any, tokenizer: Any) -> str:
    text = tokenizer.decode(list(request.input_ids))
    if text.rstrip().endswith("</tool_response><|im_end|>\n<|im_start|>assistant"):
        return "The result is 42."
    return call_text("6*7")


async def agent(gateway: Gateway, session: str) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 6*7?"}]
    first = await gateway.complete(ChatRequest(session, tuple(messages), TOOLS))
    messages += [sent_back(first.choices[0]), *tool_results(first)]
    await gateway.complete(ChatRequest(session, tuple(messages), TOOLS))
    # a rewrite: the harness drops the tool exchange
    await gateway.complete(
        ChatRequest(session, (messages[0], {"role": "user", "content": "again"}), TOOLS)
    )


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
async def test_sessions_are_written_one_row_per_segment(
    demo_tokenizer: Any, tmp_path: Path, suffix: str
) -> None:
    out = tmp_path / f"sessions{suffix}"
    model = Model(demo_tokenizer, lambda r: answers(r, demo_tokenizer))
    config = GatewayConfig(flush_seconds=0.01)
    async with Gateway(model.engine, demo_tokenizer, out=out, config=config) as gateway:
        await agent(gateway, "a")
        await agent(gateway, "b")
        gateway.attach_reward("a", 1.0)
        gateway.close_session("a")
        gateway._writer.flush()  # type: ignore[union-attr]
        # crash-safe: the closed session is a whole shard on disk before the gateway ends
        shards = read_shards(out.with_name(f"{out.name}.parts"))
        assert shards.num_rows == 2 and shards.schema == TRAJECTORY_SCHEMA
        assert not out.exists()
    assert not out.with_name(f"{out.name}.parts").exists()
    rows = read_rows(out)
    assert [(r["prompt_index"], r["sample_index"]) for r in rows] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    assert [r["reward"] for r in rows] == [1.0, 1.0, None, None]
    info = [r["metrics"]["gateway"] for r in rows]
    assert [(i["session"], i["segment"], i["segment_reason"]) for i in info] == [
        ("a", 0, "new"),
        ("a", 1, "history_rewritten"),
        ("b", 0, "new"),
        ("b", 1, "history_rewritten"),
    ]
    for row in rows:
        assert len(row["loss_mask"]) == len(row["response_ids"]) == len(row["rollout_logprobs"])
        assert row["status"] == "completed" and row["weight_version"] == "v7"
    # a trainer adapter takes the file as it takes generate's
    batch = to_verl_batch(out, prompt_length=256, response_length=128, pad_token_id=0)
    assert list(batch.non_tensors["uid"]) == ["a", "a", "b", "b"]
    assert batch.tensors["response_mask"].sum().item() == sum(sum(r["loss_mask"]) for r in rows)


async def test_trainer_extras_and_metrics_read_gateway_trajectories(demo_tokenizer: Any) -> None:
    model = Model(demo_tokenizer, lambda r: answers(r, demo_tokenizer))
    async with Gateway(model.engine, demo_tokenizer) as gateway:
        await agent(gateway, "a")
        rows = gateway.close_session("a", reward=0.5)
    extras = trajectory_extras(rows[0])
    assert extras["final_answer"] == "The result is 42."
    assert (extras["reward"], extras["num_turns"], extras["num_tool_calls"]) == (0.5, 2, 1)
    assert extras["turn_rewards"] == [None, None]
    metrics = rollout_metrics(rows)
    assert metrics["rollout/trajectories"] == 2.0


async def test_an_existing_output_is_never_overwritten(demo_tokenizer: Any, tmp_path: Path) -> None:
    out = tmp_path / "s.parquet"
    out.write_bytes(b"keep me")
    model = Model(demo_tokenizer, lambda r: "ok")
    with pytest.raises(UserError, match="exists already"):
        async with Gateway(model.engine, demo_tokenizer, out=out):
            pass
    assert out.read_bytes() == b"keep me"


async def test_after_a_crash_the_shards_are_kept_and_numbering_goes_on(
    demo_tokenizer: Any, tmp_path: Path
) -> None:
    out = tmp_path / "s.parquet"
    model = Model(demo_tokenizer, lambda r: "ok")
    gateway = Gateway(model.engine, demo_tokenizer, out=out)
    await gateway.__aenter__()
    await gateway.complete(ChatRequest("a", ({"role": "user", "content": "hi"},)))
    gateway.close_session("a")
    gateway._writer.flush()  # type: ignore[union-attr]
    gateway._writer = None  # the process dies here: nothing after the flush is written
    await gateway.__aexit__(None, None, None)  # (its task group, for the test's loop)
    assert not out.exists() and any(out.with_name("s.parquet.parts").iterdir())
    async with Gateway(model.engine, demo_tokenizer, out=out) as again:
        await again.complete(ChatRequest("b", ({"role": "user", "content": "hi"},)))
    rows = read_rows(out)
    assert [(r["group_id"], r["prompt_index"]) for r in rows] == [("a", 0), ("b", 1)]
