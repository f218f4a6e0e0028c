"""The peer baseline: ``verifiers``' ToolEnv over the server's OpenAI-compatible chat route.

verifiers (Prime Intellect) drives each rollout as messages through an OpenAI client: the
server renders the chat template and parses tool calls (``/v1/chat/completions``), and the
environment calls the Python tool functions. Both comparisons give it the same tool, prompts
and server as the other modes; rubric scoring is switched off so that only the rollout
itself is timed. verifiers is optional: ``pip install verifiers``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from toolrollout._exceptions import BenchmarkError

from ._metrics import clock, since
from ._model import DriverSpec, Workload
from ._tools import LookupClient

__all__ = ["run_tool_env", "run_verifiers"]


async def run_tool_env(
    tools: Sequence[Callable[..., Any]],
    rows: Sequence[Mapping[str, Any]],
    *,
    url: str,
    max_turns: int,
    sampling: dict[str, Any],
    model: str | None = None,
    http_client: Any = None,
) -> tuple[dict[str, Any], list[str]]:
    """One ToolEnv rollout per row against ``url`` (the served model unless ``model``);
    the counts and the measured time, and each failed rollout's error."""
    try:
        import verifiers as vf
        from datasets import Dataset
        from openai import AsyncOpenAI
        from verifiers.clients import OpenAIChatCompletionsClient
    except ImportError as exc:
        raise BenchmarkError(
            "the verifiers baseline needs the verifiers package: pip install verifiers"
        ) from exc
    logging.getLogger("verifiers").setLevel(logging.WARNING)
    inputs = [
        {"prompt": row["messages"], "example_id": i, "answer": ""} for i, row in enumerate(rows)
    ]
    env = vf.ToolEnv(
        tools=list(tools),
        max_turns=max_turns,
        score_rollouts=False,
        dataset=Dataset.from_list(inputs),
    )
    openai_client = AsyncOpenAI(
        base_url=f"{url}/v1",
        api_key="unused",
        max_retries=0,
        timeout=600.0,
        http_client=http_client,
    )
    model = model or (await openai_client.models.list()).data[0].id
    started = clock()
    results = await env.generate(
        inputs,
        client=OpenAIChatCompletionsClient(openai_client),
        model=model,
        sampling_args=sampling,
        max_concurrent=-1,
        on_start=lambda *args: None,
        on_progress=lambda *args: None,
    )
    measured = since(started)
    await openai_client.close()
    outputs = results["outputs"]

    def count(role: str) -> int:
        messages = [m for o in outputs for m in (o.get("completion") or [])]
        return sum(
            (m.get("role") if isinstance(m, dict) else getattr(m, "role", None)) == role
            for m in messages
        )

    counts = {
        "trajectories": len(outputs),
        "completed": sum(1 for o in outputs if o.get("is_completed") and not o.get("error")),
        "turns": count("assistant"),
        "tool_calls": count("tool"),
        # The chat route reports no token ids; count what the server generated per turn.
        "generated_tokens": sum(_completion_tokens(o) for o in outputs),
        **measured,
        "note": f"verifiers {getattr(vf, '__version__', '?')} ToolEnv over /v1/chat/completions",
    }
    return counts, [repr(o["error"]) for o in outputs if o.get("error")]


async def run_verifiers(spec: DriverSpec, workload: Workload, tokenizer: Any) -> dict[str, Any]:
    """The latency-model comparison's verifiers mode, over the benchmark's lookup tool."""
    lookup = LookupClient(spec.tool_url)
    counts, errors = await run_tool_env(
        [lookup.lookup],  # its name and docstring are the schema verifiers sends
        workload.rows(),
        url=spec.engine_urls[0],
        max_turns=workload.max_turns + 1,
        sampling={"max_tokens": workload.max_new_tokens, "temperature": 1.0},
        model="latency-model",
    )
    await lookup.aclose()
    counts["note"] += f"; errors {len(errors)}"
    return counts


def _completion_tokens(output: Any) -> int:
    usage = output.get("token_usage") or {}
    if isinstance(usage, dict):
        for key in ("output_tokens", "completion_tokens"):
            if isinstance(usage.get(key), int | float):
                return int(usage[key])
    return 0
