"""verl: the agent loop inside verl's own AgentLoopWorker, and the parquet -> batch converter.

The seam is Ray: a GPU-less test cannot start verl's rollout replicas as Ray actors. verl's
own ``GlobalRequestLoadBalancer`` (sticky sessions, least in-flight) runs in-process behind a
handle with Ray's ``method.remote(...)`` surface, and routes verl's unmodified
``LLMServerClient`` between two in-process replicas (``EmbeddedReplica``) that serve the demo
model with toolrollout's EmbeddedEngine, following verl's SGLang replica semantics
(``max_tokens`` / ``max_new_tokens`` and ``logprobs`` popped from ``sampling_params``,
``TokenOutput`` back). Everything else (worker, hydra instantiation, registry, routing,
padding, DataProto) is verl's.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import numpy as np
import pytest
import torch
import verl  # collected only when it imports (conftest.py)
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopMetrics,
    AgentLoopOutput,
    AgentLoopWorker,
    _agent_loop_registry,
)
from verl.protocol import DataProto
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput
from verl.workers.rollout.router import GlobalRequestLoadBalancer

from toolrollout import RolloutConfig, RolloutRunner, SamplingParams
from toolrollout.apps.demo import DEMO_MODEL_PATH, load_demo_prompts
from toolrollout.engines import GenerateRequest
from toolrollout.integrations import VerlServerEngine, to_verl_batch
from toolrollout.rollout import Trajectory, write_trajectories
from toolrollout.testing import ScriptedEngine
from toolrollout.tools import calculator_tool

REPO = Path(__file__).resolve().parents[2]
PROMPT_LENGTH = 320
RESPONSE_LENGTH = 96


class EmbeddedReplica:
    """Stands in for one verl rollout replica actor (``handle.generate.remote(...)``)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.generate = SimpleNamespace(remote=self._generate)
        self.sampling_params: list[dict[str, Any]] = []

    async def _generate(
        self,
        *,
        request_id: str,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **_: Any,
    ) -> Any:
        params = dict(sampling_params)
        self.sampling_params.append(dict(params))
        max_new = params.pop("max_new_tokens", None) or params.pop("max_tokens", None)
        return_logprob = params.pop("logprobs", False)
        sampling = SamplingParams(
            max_new_tokens=int(max_new or RESPONSE_LENGTH),
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            top_k=int(params.get("top_k", -1)),
            stop_token_ids=tuple(params.get("stop_token_ids") or ()),
        )
        result = await self.engine.generate(
            GenerateRequest(tuple(prompt_ids), sampling, rid=request_id)
        )
        return TokenOutput(
            token_ids=list(result.output_ids),
            log_probs=list(result.output_logprobs) if return_logprob else None,
            stop_reason=result.finish_reason.type,
            extra_fields={"global_steps": 7},
        )


class _Ready:
    """An already-computed Ray ``ObjectRef`` stand-in: awaitable, or safely dropped."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __await__(self) -> Any:
        return self.value
        yield  # a generator, so ``await`` works without suspending


class InProcessActor:
    """A plain object behind a Ray actor handle's surface, recording each call.

    ``handle.method.remote(*args, **kwargs)`` runs the method at once and returns an
    awaitable of its result, as Ray's handle returns an awaitable ``ObjectRef``.
    """

    def __init__(self, instance: Any) -> None:
        self.instance = instance
        self.calls: list[tuple[str, dict[str, Any], Any]] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.instance, name)

        def remote(**kwargs: Any) -> _Ready:
            result = method(**kwargs)
            self.calls.append((name, kwargs, result))
            return _Ready(result)

        return SimpleNamespace(remote=remote)


FUNCTION_TOOLS = '''
from verl.tools.function_tool import function_tool
from toolrollout.tools.calculator import calculator as _calculator


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Args:
        expression: Arithmetic with + - * / // % ** and parentheses, e.g. 3 * (4 + 5)
    """
    return _calculator(expression)
'''


ONE_AT_A_TIME = """
tools:
  - class_name: "tests.integrations._overlap_tool.calculator"
    config: {type: native, max_concurrency: 1}
"""


def _config(tmp: Path) -> Any:
    path = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    config = OmegaConf.load(path)
    (tmp / "tools.py").write_text(FUNCTION_TOOLS, encoding="utf-8")
    (tmp / "agent_loops.yaml").write_text(
        textwrap.dedent(
            f"""\
            - name: toolrollout_verl_tools
              _target_: toolrollout.integrations.ToolRolloutAgentLoop
              reward: toolrollout.rewards.numeric_match
            - name: toolrollout_own_tools
              _target_: toolrollout.integrations.ToolRolloutAgentLoop
              tool_config_path: {REPO / "tool_configs" / "calculator.yaml"}
              tool_parser: qwen25
              reward: toolrollout.rewards.numeric_match
            - name: toolrollout_one_at_a_time
              _target_: toolrollout.integrations.ToolRolloutAgentLoop
              tool_config_path: {tmp / "one_at_a_time.yaml"}
            """
        ),
        encoding="utf-8",
    )
    (tmp / "one_at_a_time.yaml").write_text(ONE_AT_A_TIME, encoding="utf-8")
    config.actor_rollout_ref.model.path = str(DEMO_MODEL_PATH)
    rollout = config.actor_rollout_ref.rollout
    rollout.name = "sglang"
    rollout.prompt_length = PROMPT_LENGTH
    rollout.response_length = RESPONSE_LENGTH
    rollout.calculate_log_probs = True
    rollout.multi_turn.enable = True
    rollout.multi_turn.format = "hermes"
    rollout.multi_turn.max_assistant_turns = 3
    rollout.multi_turn.function_tool_path = str(tmp / "tools.py")
    rollout.agent.agent_loop_config_path = str(tmp / "agent_loops.yaml")
    return config


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """verl's worker and client, verl's balancer over two replicas sharing one engine."""
    from toolrollout.engines.embedded import EmbeddedEngine

    torch.set_num_threads(1)
    config = _config(tmp_path_factory.mktemp("verl"))
    engine = EmbeddedEngine(DEMO_MODEL_PATH, num_threads=1, max_batch_size=8)
    # The fakes stand in for Ray actor handles, which verl's signatures name.
    replicas: dict[str, Any] = {
        "replica-0": EmbeddedReplica(engine),
        "replica-1": EmbeddedReplica(engine),
    }
    balancer: Any = InProcessActor(GlobalRequestLoadBalancer(servers=dict(replicas)))
    client = LLMServerClient(config, load_balancer_handle=balancer)
    worker = AgentLoopWorker(config, llm_client=client)
    yield SimpleNamespace(worker=worker, engine=engine, replicas=replicas, balancer=balancer)
    anyio.run(engine.aclose)


@pytest.fixture(scope="module")
def worker(rig: Any) -> Any:
    return rig.worker


def _objects(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def test_agent_loop_is_registered_by_name() -> None:
    from toolrollout.integrations import ToolRolloutAgentLoop

    entry = _agent_loop_registry["toolrollout_agent"]
    assert entry["_target_"].endswith("._verl_loop.ToolRolloutAgentLoop")
    assert ToolRolloutAgentLoop.__name__ == "ToolRolloutAgentLoop"


@pytest.mark.slow
def test_generate_sequences_in_verls_worker(rig: Any) -> None:
    worker = rig.worker
    rows = load_demo_prompts()[:2]
    names = ["toolrollout_verl_tools", "toolrollout_own_tools"]
    batch = DataProto(
        non_tensor_batch={
            "raw_prompt": _objects([r["messages"] for r in rows for _ in range(2)]),
            "agent_name": _objects([names[i % 2] for i in range(4)]),
            "index": np.array([0, 0, 1, 1]),
            "reward_model": _objects([{"ground_truth": r["answer"]} for r in rows for _ in (0, 1)]),
            "data_source": _objects(["demo"] * 4),
        },
        meta_info={"global_steps": 7},
    )

    async def main() -> Any:
        await rig.engine.start()
        return await worker.generate_sequences(batch)

    out = anyio.run(main)
    tokenizer = worker.tokenizer
    tensors = out.batch
    assert tensors["prompts"].shape == (4, PROMPT_LENGTH)
    assert tensors["responses"].shape == (4, RESPONSE_LENGTH)
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert tensors[key].shape == (4, PROMPT_LENGTH + RESPONSE_LENGTH)
    assert tensors["rollout_log_probs"].shape == (4, RESPONSE_LENGTH)
    assert "rm_scores" in tensors.keys()  # reward_score from the loop, verl's reward loop skipped

    extras = out.non_tensor_batch["toolrollout"]
    tool_tokens = 0
    for i in range(4):
        attn = tensors["attention_mask"][i, PROMPT_LENGTH:]
        mask = tensors["response_mask"][i]
        ids = tensors["responses"][i]
        logprobs = tensors["rollout_log_probs"][i]
        n = int(attn.sum())
        assert n > 0 and not mask[n:].any()
        tool = [int(t) for t, m in zip(ids[:n], mask[:n], strict=True) if m == 0]
        model = [int(t) for t, m in zip(ids[:n], mask[:n], strict=True) if m == 1]
        assert "<tool_response>" not in tokenizer.decode(model)
        if tool:
            tool_tokens += len(tool)
            assert "<tool_response>" in tokenizer.decode(tool)
        assert torch.all(logprobs[mask == 0] == 0)
        assert torch.all(logprobs[:n][mask[:n] == 1] < 0)
        info = extras[i]
        if tool:  # a tool-result turn exists only after a call (or an unparsable one)
            assert info["num_tool_calls"] + info["parse_errors"] >= 1
        assert info["weight_version"] == "7"  # verl's global_steps came through
        score = tensors["rm_scores"][i, n - 1].item()
        assert score == (info["reward"] or 0.0)
        assert out.non_tensor_batch["__num_turns__"][i] >= 2
    assert tool_tokens > 0, "no trajectory called the calculator"
    # Sticky sessions: every turn of a trajectory reused one verl request id, so verl's
    # balancer sent all of them to one replica; every acquired replica was released.
    acquired = [
        (kw["request_id"], out[0])
        for name, kw, out in rig.balancer.calls
        if name == "acquire_server"
    ]
    turns = Counter(rid for rid, _ in acquired)
    assert len(turns) == 4
    assert sorted(turns.values()) == sorted(int(e["num_turns"]) for e in extras)
    assert all(len({sid for r, sid in acquired if r == rid}) == 1 for rid in turns)
    released = Counter(
        kw["server_id"] for name, kw, _ in rig.balancer.calls if name == "release_server"
    )
    assert released == Counter(sid for _, sid in acquired)
    assert all(rig.balancer.instance.get_inflight_count(sid) == 0 for sid in rig.replicas)
    sent = [p for r in rig.replicas.values() for p in r.sampling_params]
    assert len(sent) == len(acquired)
    assert all(p["logprobs"] is True and p["max_tokens"] <= RESPONSE_LENGTH for p in sent)


@pytest.mark.slow
def test_a_tool_limit_holds_across_a_workers_samples(rig: Any) -> None:
    """verl builds an agent loop per sample; a tool limited to one call at a time must
    still run one call at a time across all of a worker's concurrent samples."""
    from tests.integrations import _overlap_tool

    rows = load_demo_prompts()[:4]
    batch = DataProto(
        non_tensor_batch={
            "raw_prompt": _objects([r["messages"] for r in rows]),
            "agent_name": _objects(["toolrollout_one_at_a_time"] * len(rows)),
            "index": np.arange(len(rows)),
            "reward_model": _objects([{"ground_truth": r["answer"]} for r in rows]),
            "data_source": _objects(["demo"] * len(rows)),
        },
        meta_info={"global_steps": 7},
    )

    async def main() -> Any:
        await rig.engine.start()
        return await rig.worker.generate_sequences(batch)

    out = anyio.run(main)
    calls = sum(int(e["num_tool_calls"]) for e in out.non_tensor_batch["toolrollout"])
    assert calls >= 2 and _overlap_tool.calls == calls, "the samples made too few calls"
    assert _overlap_tool.most_at_once == 1


def _scripted_trajectories(tokenizer: Any) -> list[Trajectory]:
    from tests.integrations._scripted import calculator_script

    runner = RolloutRunner(
        ScriptedEngine(calculator_script(tokenizer)),
        tokenizer,
        [calculator_tool()],
        config=RolloutConfig(sampling=SamplingParams(max_new_tokens=64), n=2),
        rewards=[lambda t: float(t.num_tool_calls)],
    )
    rows = load_demo_prompts()[:2]
    return runner.run_sync([{"messages": r["messages"], "answer": r["answer"]} for r in rows])


def test_parquet_batch_matches_verls_own_padding(worker: Any, tmp_path: Path) -> None:
    tokenizer = worker.tokenizer
    trajectories = _scripted_trajectories(tokenizer)
    path = tmp_path / "rollouts.parquet"
    write_trajectories(trajectories, path)
    # A response length shorter than some responses exercises verl's cut as well.
    response_length = 40
    assert any(len(t.response_ids) > response_length for t in trajectories)
    ours = to_verl_batch(
        path,
        prompt_length=PROMPT_LENGTH,
        response_length=response_length,
        pad_token_id=tokenizer.pad_token_id,
    )

    async def verl_padding() -> Any:
        worker.rollout_config.response_length = response_length
        try:
            internal = []
            for t in trajectories:
                output = AgentLoopOutput(
                    prompt_ids=list(t.prompt_ids),
                    response_ids=t.response_ids[:response_length],
                    response_mask=t.loss_mask[:response_length],
                    response_logprobs=t.rollout_logprobs[:response_length],
                    reward_score=t.reward,
                    num_turns=3,
                    metrics=AgentLoopMetrics(),
                )
                internal.append(
                    await worker._agent_loop_postprocess(
                        output, False, raw_prompt=list(t.messages[:2])
                    )
                )
            return worker._postprocess(internal)
        finally:
            worker.rollout_config.response_length = RESPONSE_LENGTH

    theirs = anyio.run(verl_padding)
    for key in (*theirs.batch.keys(),):
        assert key in ours.tensors, key
        assert torch.equal(ours.tensors[key], theirs.batch[key].to(ours.tensors[key].dtype)), key
    proto = ours.to_dataproto()
    assert isinstance(proto, DataProto) and len(proto) == len(trajectories)
    assert list(proto.non_tensor_batch["uid"]) == [t.group_id for t in trajectories]
    # verl's count (ToolAgentLoop): user turns (tool results) + assistant turns + 1.
    assert list(proto.non_tensor_batch["__num_turns__"]) == [1 + 2 + 1] * len(trajectories)


def test_server_engine_maps_verl_stop_reasons() -> None:
    class Manager:
        def __init__(self, output: Any) -> None:
            self.output = output
            self.calls: list[tuple[str, dict[str, Any]]] = []

        async def generate(self, request_id: str, **kwargs: Any) -> Any:
            self.calls.append((request_id, kwargs))
            return self.output

    def run(output: Any, max_new: int = 4) -> Any:
        manager = Manager(output)
        engine = VerlServerEngine(manager, eos_token_ids=[9])
        request = GenerateRequest((1, 2), SamplingParams(max_new_tokens=max_new), session_id="s1")
        return anyio.run(engine.generate, request), manager

    done = TokenOutput(token_ids=[5, 9], log_probs=[-0.1, -0.2], stop_reason="completed")
    result, manager = run(done)
    assert result.finish_reason.type == "stop" and result.finish_reason.matched == 9
    assert manager.calls[0][0] == "s1"  # the trajectory id is verl's sticky request id
    assert manager.calls[0][1]["prompt_ids"] == [1, 2]
    cut = TokenOutput(token_ids=[5, 6, 7, 8], log_probs=[-0.1] * 4, stop_reason="completed")
    assert run(cut)[0].finish_reason.type == "length"
    aborted = TokenOutput(token_ids=[5], log_probs=[-0.1], stop_reason="aborted")
    assert run(aborted)[0].finish_reason.type == "abort"
    length = TokenOutput(token_ids=[5], log_probs=[-0.1], stop_reason="length")
    assert run(length)[0].finish_reason.type == "length"
