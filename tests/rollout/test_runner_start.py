"""How a run starts its trajectories: each distinct prompt rendered once, in batches.

Rendering (chat template + tokenizer) is synchronous CPU work that blocks the event loop;
issue 20's scale run measured a 100 s stall when 10,000 trajectories rendered their
prompts in one turn of the loop.
"""

from __future__ import annotations

from typing import Any

from toolrollout.chat import ChatFormat
from toolrollout.engines._types import GenerateRequest, GenerateResult
from toolrollout.rollout import RolloutConfig, RolloutRunner, TrajectoryStatus
from toolrollout.rollout._batch import START_BATCH
from toolrollout.testing import ScriptedEngine, ScriptedOutput


def _answers(tokenizer: Any, count: int) -> list[ScriptedOutput]:
    ids = list(tokenizer.encode("Done.<|im_end|>", add_special_tokens=False))
    return [ScriptedOutput(ids, logprobs=[-0.5] * len(ids)) for _ in range(count)]


def _prompts(count: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"Question number {i}?"}] for i in range(count)]


class CountingEngine(ScriptedEngine):
    """Records how many prompts had been rendered when the first request arrived."""

    def __init__(self, outputs: list[ScriptedOutput], renders: list[int]) -> None:
        super().__init__(outputs)
        self.renders = renders
        self.renders_at_first_request: int | None = None

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        if self.renders_at_first_request is None:
            self.renders_at_first_request = len(self.renders)
        return await super().generate(request)


def _count_renders(monkeypatch: Any) -> list[int]:
    """Counts prompt renders: the template with the generation prompt (a tool turn's delta
    and the drift check render without it)."""
    renders: list[int] = []
    original = ChatFormat.render_text

    def counted(self: ChatFormat, messages: Any, *, add_generation_prompt: bool) -> str:
        if add_generation_prompt:
            renders.append(1)
        return original(self, messages, add_generation_prompt=add_generation_prompt)

    monkeypatch.setattr(ChatFormat, "render_text", counted)
    return renders


async def test_the_samples_of_a_prompt_share_one_render(
    demo_tokenizer: Any, monkeypatch: Any
) -> None:
    renders = _count_renders(monkeypatch)
    prompts, n = 3, 4
    engine = ScriptedEngine(_answers(demo_tokenizer, prompts * n))
    runner = RolloutRunner(engine, demo_tokenizer, [], config=RolloutConfig(n=n))
    trajectories = await runner.run(_prompts(prompts))
    assert [t.status for t in trajectories] == [TrajectoryStatus.COMPLETED] * prompts * n
    assert len(renders) == prompts  # not prompts * n
    for index in range(prompts):  # the shared ids are the prompt's own, for every sample
        own = demo_tokenizer.apply_chat_template(
            _prompts(prompts)[index], tokenize=False, add_generation_prompt=True
        )
        expected = tuple(demo_tokenizer.encode(own, add_special_tokens=False))
        samples = [t for t in trajectories if t.prompt_index == index]
        assert [t.prompt_ids for t in samples] == [expected] * n
    assert [len(r.input_ids) for r in engine.requests] == [len(t.prompt_ids) for t in trajectories]


async def test_a_large_run_sends_its_first_request_before_rendering_every_prompt(
    demo_tokenizer: Any, monkeypatch: Any
) -> None:
    renders = _count_renders(monkeypatch)
    prompts = 6 * START_BATCH
    engine = CountingEngine(_answers(demo_tokenizer, prompts), renders)
    config = RolloutConfig(concurrency=prompts)
    trajectories = await RolloutRunner(engine, demo_tokenizer, [], config=config).run(
        _prompts(prompts)
    )
    assert len(trajectories) == prompts and len(renders) == prompts
    # All started in one turn of the loop, every prompt would be rendered before the first
    # request goes out; in batches the first request leaves within the first two batches.
    assert engine.renders_at_first_request is not None
    assert engine.renders_at_first_request <= 2 * START_BATCH


async def test_each_call_of_a_runner_draws_its_own_seeds(demo_tokenizer: Any) -> None:
    """A trainer calls one runner every step: with ``seed`` set, step k must not replay the
    random numbers of step 0 at every batch position (the same samples of a revisited
    prompt), while a fresh runner's first call keeps the seeds it always had."""
    config = RolloutConfig(n=2, seed=7)
    engine = ScriptedEngine(_answers(demo_tokenizer, 3 * 4))
    runner = RolloutRunner(engine, demo_tokenizer, [], config=config)
    await runner.run(_prompts(2))
    await runner.run(_prompts(2))
    seeds = [r.sampling.seed for r in engine.requests]
    first, second = seeds[:4], seeds[4:]
    assert len(set(first)) == 4 and len(set(second)) == 4  # per (prompt, sample)
    assert not set(first) & set(second)  # the second call draws anew
    fresh = ScriptedEngine(_answers(demo_tokenizer, 4))
    await RolloutRunner(fresh, demo_tokenizer, [], config=config).run(_prompts(2))
    assert [r.sampling.seed for r in fresh.requests] == first  # reproducible per run


async def test_each_start_batch_is_tokenized_in_one_call(
    demo_tokenizer: Any, monkeypatch: Any
) -> None:
    """The prompts of a start batch go through the tokenizer together (prerender_prompts),
    and every sample gets the ids a render of its own prompt gives."""
    prompts = 2 * START_BATCH + 5
    engine = ScriptedEngine(_answers(demo_tokenizer, prompts))
    config = RolloutConfig(concurrency=prompts, drift_check=False)
    runner = RolloutRunner(engine, demo_tokenizer, [], config=config)  # its format's probes
    calls: list[int] = []
    original = ChatFormat.encode_many

    def counted(self: ChatFormat, texts: Any) -> list[list[int]]:
        calls.append(len(texts))
        return original(self, texts)

    monkeypatch.setattr(ChatFormat, "encode_many", counted)
    trajectories = await runner.run(_prompts(prompts))
    assert calls == [START_BATCH, START_BATCH, 5]  # no prompt tokenized on its own
    chat = ChatFormat(demo_tokenizer)
    for trajectory, prompt in zip(trajectories, _prompts(prompts), strict=True):
        assert list(trajectory.prompt_ids) == chat.render_prompt(prompt)


async def test_a_prompt_that_fails_to_render_is_a_failed_row_not_a_failed_run(
    demo_tokenizer: Any, monkeypatch: Any
) -> None:
    """The batch render skips a prompt the template fails on, and a batch tokenizer call
    that raises is dropped: each trajectory then renders its own prompt, the broken one
    reports the error in its row, and the others run."""
    from toolrollout.exceptions import TokenizationError

    prompts = _prompts(3)
    prompts[1] = [{"role": "user", "content": "BREAK the template"}]
    render, encode_many = ChatFormat.render_text, ChatFormat.encode_many

    def failing_render(self: ChatFormat, messages: Any, *, add_generation_prompt: bool) -> str:
        if "BREAK" in str(messages[0]["content"]):
            raise TokenizationError("the chat template failed to render: test")
        return render(self, messages, add_generation_prompt=add_generation_prompt)

    def failing_batches(self: ChatFormat, texts: Any) -> list[list[int]]:
        if len(texts) > 1:
            raise RuntimeError("a batch the tokenizer refuses")
        return encode_many(self, texts)

    engine = ScriptedEngine(_answers(demo_tokenizer, 2))
    runner = RolloutRunner(engine, demo_tokenizer, [], config=RolloutConfig(drift_check=False))
    monkeypatch.setattr(ChatFormat, "render_text", failing_render)
    monkeypatch.setattr(ChatFormat, "encode_many", failing_batches)
    trajectories = await runner.run(prompts)
    assert [t.status for t in trajectories] == [
        TrajectoryStatus.COMPLETED,
        TrajectoryStatus.FAILED,
        TrajectoryStatus.COMPLETED,
    ]
    assert "failed to render" in str(trajectories[1].error)
