"""Roll out the demo task from Python: the library entry point a trainer would call.

    python examples/library_rollout.py                 # embedded engine, in-process
    python examples/library_rollout.py http://127.0.0.1:30000   # any SGLang server

Prints one line per trajectory and the token bookkeeping a GRPO trainer consumes.
"""

from __future__ import annotations

import sys

import anyio
from transformers import AutoTokenizer

from toolrollout import (
    Engine,
    RolloutConfig,
    RolloutRunner,
    SamplingParams,
    SGLangClient,
    numeric_match,
)
from toolrollout.apps.demo import DEMO_MODEL_PATH, load_demo_prompts
from toolrollout.tools import calculator_tool


async def main(engine_url: str | None) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))
    engine: Engine
    if engine_url:
        engine = SGLangClient(engine_url)
    else:
        from toolrollout.engines import EmbeddedEngine

        engine = EmbeddedEngine(DEMO_MODEL_PATH, num_threads=1)
    async with engine:
        runner = RolloutRunner(
            engine,
            tokenizer,
            [calculator_tool()],
            config=RolloutConfig(sampling=SamplingParams(max_new_tokens=96), n=2, seed=0),
            rewards=[numeric_match],
        )
        trajectories = await runner.run(load_demo_prompts()[:4])
    for t in trajectories:
        trained = sum(t.loss_mask)
        print(
            f"{t.uid}: {t.status} reward={t.reward} turns={t.num_turns} "
            f"tool_calls={t.num_tool_calls} tokens={len(t.response_ids)} trained={trained}"
        )


if __name__ == "__main__":
    anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else None)
