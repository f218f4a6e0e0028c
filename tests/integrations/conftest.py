"""Shared fixtures: the demo tokenizer, and a scripted engine that calls the calculator once.

The scripted engine is the documented test seam (``toolrollout.testing``); every id it
returns is derived from the demo tokenizer, never hard-coded, so a retrained demo model
keeps these tests valid.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from toolrollout.demo import DEMO_MODEL_PATH
from toolrollout.engines import GenerateRequest
from toolrollout.testing import ScriptedEngine, ScriptedOutput


@pytest.fixture(scope="session")
def demo_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))


def calculator_script(tokenizer: Any, expression: str = "4 * 341") -> Any:
    """First turn: one calculator call; once a tool response is in the context: an answer."""
    eos = tokenizer.eos_token_id
    payload = json.dumps({"name": "calculator", "arguments": {"expression": expression}})
    call = tokenizer.encode(f"<tool_call>\n{payload}\n</tool_call>", add_special_tokens=False)
    answer = tokenizer.encode("The answer is 1364.", add_special_tokens=False)

    def script(request: GenerateRequest) -> ScriptedOutput:
        seen_tool = "<tool_response>" in tokenizer.decode(list(request.input_ids))
        out = [*answer, eos] if seen_tool else [*call, eos]
        # Distinct negative logprobs, so a test can tell them from the 0.0 of tool tokens.
        return ScriptedOutput(out, logprobs=[-0.5 - 0.01 * i for i in range(len(out))])

    return script


@pytest.fixture
def scripted_engine(demo_tokenizer: Any) -> ScriptedEngine:
    return ScriptedEngine(calculator_script(demo_tokenizer))
