"""A scripted engine answer: one calculator call, then the answer once a result is in context.

Every id is derived from the tokenizer, never hard-coded, so a retrained demo model keeps
the tests valid.
"""

from __future__ import annotations

import json
from typing import Any

from toolrollout.engines import GenerateRequest
from toolrollout.testing import ScriptedOutput


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
