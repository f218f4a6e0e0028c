"""The runner's tool parser defaults to the chat template family's (not always qwen25).

A Llama-3 model writes a bare JSON call; parsed with the Qwen parser it would be plain
content and the trajectory would end ``completed`` with no tool call and no error.
"""

from __future__ import annotations

from typing import Any

import anyio
from transformers import PreTrainedTokenizerBase

from toolrollout.rollout import RolloutConfig, RolloutRunner, TrajectoryStatus
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import function_tool


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _run(tokenizer: PreTrainedTokenizerBase, config: RolloutConfig) -> Any:
    def out(text: str) -> ScriptedOutput:
        ids = tokenizer.encode(text, add_special_tokens=False)
        return ScriptedOutput(ids, logprobs=[-0.5] * len(ids))

    engine = ScriptedEngine(
        [out('{"name": "add", "parameters": {"a": 2, "b": 3}}<|eot_id|>'), out("5<|eot_id|>")]
    )
    runner = RolloutRunner(engine, tokenizer, [function_tool(add)], config=config)
    [trajectory] = anyio.run(runner.run, [[{"role": "user", "content": "2+3?"}]])
    return runner, trajectory


def test_llama3_json_call_is_a_call_by_default(llama3_tokenizer: PreTrainedTokenizerBase) -> None:
    runner, trajectory = _run(llama3_tokenizer, RolloutConfig())
    assert runner.chat.family.name == "llama3"
    assert trajectory.status is TrajectoryStatus.COMPLETED, trajectory.error
    assert trajectory.num_tool_calls == 1 and trajectory.tool_errors == 0
    assert [span.kind for span in trajectory.spans] == ["model", "tool", "model"]
    tool = [m for m in trajectory.messages if m["role"] in ("tool", "ipython")]
    assert tool and tool[0]["content"] == "5"


def test_an_explicit_parser_still_wins(llama3_tokenizer: PreTrainedTokenizerBase) -> None:
    _, trajectory = _run(llama3_tokenizer, RolloutConfig(tool_parser="qwen25"))
    assert trajectory.num_tool_calls == 0  # the JSON is plain content to the Qwen parser
