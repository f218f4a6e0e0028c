"""The peer baseline: ``verifiers``' ToolEnv over the server's OpenAI-compatible chat route.

verifiers (Prime Intellect) drives each rollout as messages through an OpenAI client: the
server renders the chat template and parses tool calls (``/v1/chat/completions``), and the
environment calls the Python tool functions. The benchmark gives it the same tool service
(through the same :class:`LookupClient`), the same prompts and the same server; rubric
scoring is switched off so that only the rollout itself is timed. verifiers is optional:
``pip install verifiers``.
"""

from __future__ import annotations

import logging
import resource
import time
from typing import Any

from toolrollout._exceptions import BenchmarkError

from ._model import DriverSpec, Workload
from ._tools import LookupClient

__all__ = ["run_verifiers"]


async def run_verifiers(
    spec: DriverSpec, workload: Workload, lookup: LookupClient
) -> dict[str, Any]:
    try:
        import verifiers as vf
        from openai import AsyncOpenAI
        from verifiers.clients import OpenAIChatCompletionsClient
    except ImportError as exc:
        raise BenchmarkError(
            "the verifiers baseline needs the verifiers package: pip install verifiers"
        ) from exc
    logging.getLogger("verifiers").setLevel(logging.WARNING)

    async def lookup_tool(key: str) -> str:
        """Look up a record by its key.

        Args:
            key: the record key named in the task.
        """
        return await lookup.lookup(key)

    from datasets import Dataset

    lookup_tool.__name__ = "lookup"
    inputs = [
        {"prompt": row["messages"], "example_id": i, "answer": ""}
        for i, row in enumerate(workload.rows())
    ]
    env = vf.ToolEnv(
        tools=[lookup_tool],
        max_turns=workload.max_turns + 1,
        score_rollouts=False,
        dataset=Dataset.from_list(inputs),
    )
    openai_client = AsyncOpenAI(
        base_url=f"{spec.engine_urls[0]}/v1", api_key="unused", max_retries=0, timeout=600.0
    )
    client = OpenAIChatCompletionsClient(openai_client)
    sampling = {"max_tokens": workload.tokens_per_turn * 2 + 32, "temperature": 1.0}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    wall0, cpu0 = time.perf_counter(), usage.ru_utime + usage.ru_stime
    results = await env.generate(
        inputs,
        client=client,
        model="latency-model",
        sampling_args=sampling,
        max_concurrent=-1,
        on_start=lambda *args: None,
        on_progress=lambda *args: None,
    )
    usage = resource.getrusage(resource.RUSAGE_SELF)
    wall, cpu = time.perf_counter() - wall0, usage.ru_utime + usage.ru_stime - cpu0
    await openai_client.close()
    await lookup.aclose()
    outputs = results["outputs"]
    turns = 0
    errors = 0
    for output in outputs:
        completion = output.get("completion") or []
        turns += sum(1 for m in completion if _role(m) == "assistant")
        errors += 1 if output.get("error") else 0
    version = getattr(vf, "__version__", "?")
    return {
        "trajectories": len(outputs),
        "completed": sum(1 for o in outputs if o.get("is_completed") and not o.get("error")),
        "turns": turns,
        # The chat route reports no token ids; count what the server generated per turn.
        "generated_tokens": sum(_completion_tokens(o) for o in outputs),
        "makespan_s": wall,
        "client_cpu_s": cpu,
        "measured_until": wall0 + wall,
        "note": f"verifiers {version} ToolEnv over /v1/chat/completions; errors {errors}",
    }


def _role(message: Any) -> str | None:
    if isinstance(message, dict):
        return message.get("role")
    return getattr(message, "role", None)


def _completion_tokens(output: Any) -> int:
    usage = output.get("token_usage") or {}
    if isinstance(usage, dict):
        for key in ("output_tokens", "completion_tokens"):
            if isinstance(usage.get(key), int | float):
                return int(usage[key])
    return 0
