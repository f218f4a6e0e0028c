"""Client-side scheduling policies (issue 20): each one's effect in a small run.

The server is the benchmark's latency model, in process over httpx's ASGI transport, whose
scheduling follows SGLang's (tests/bench/test_scheduling_server.py checks that part).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import Any

import anyio
import httpx
import pytest
from tests._latency import lookup
from transformers import AutoTokenizer

from toolrollout._exceptions import UserError
from toolrollout.apps.bench import LatencyModel, ServerScheduling, Workload
from toolrollout.apps.bench._scheduler import LatencyServer
from toolrollout.apps.bench._server import create_latency_app
from toolrollout.apps.demo import DEMO_MODEL_PATH
from toolrollout.engines import SamplingParams, SGLangClient
from toolrollout.engines._admission import AdmissionControl, LagAdmission
from toolrollout.engines._limiter import OrderedLimiter
from toolrollout.engines._priority import PriorityPolicy, ServerPriority, WorkHistory
from toolrollout.engines._scheduling import Scheduler, SchedulingConfig
from toolrollout.rollout import RolloutConfig, RolloutRunner


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(DEMO_MODEL_PATH))


def _server(tokenizer: Any, scheduling: ServerScheduling, **model: Any) -> LatencyServer:
    spec = {"capacity": 64, "prefill_per_token_s": 0.0, "decode_per_token_s": 0.0, **model}
    return LatencyServer(
        tokenizer, LatencyModel(**spec), model_name="latency-model", scheduling=scheduling
    )


async def _run(
    tokenizer: Any,
    servers: list[LatencyServer],
    scheduling: SchedulingConfig | None,
    workload: Workload,
    *,
    concurrency: int = 256,
    on_result: Any = None,
) -> list[Any]:
    apps = {f"http://s{i}": create_latency_app(s) for i, s in enumerate(servers)}

    class Mux(httpx.AsyncBaseTransport):
        """One ASGI app per server name, as if they were separate hosts."""

        def __init__(self) -> None:
            self.transports = {url: httpx.ASGITransport(app=app) for url, app in apps.items()}

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            base = f"{request.url.scheme}://{request.url.host}"
            return await self.transports[base].handle_async_request(request)

    rows = workload.rows()
    for row, item in zip(rows, workload.items, strict=True):
        row["group"] = item.group
    config = RolloutConfig(
        sampling=SamplingParams(max_new_tokens=96),
        max_turns=8,
        scheduling=scheduling,
        concurrency=concurrency,
    )
    async with SGLangClient(list(apps), transport=Mux()) as client:
        runner = RolloutRunner(client, tokenizer, [lookup], config=config)
        return await runner.run(rows, on_result=on_result)


def test_server_priority_reads_sglangs_server_args() -> None:
    assert ServerPriority.from_server_info({}) == ServerPriority(False)
    info: dict[str, Any] = {
        "enable_priority_scheduling": True,
        "schedule_low_priority_values_first": True,
    }
    assert ServerPriority.from_server_info(info) == ServerPriority(True, True)
    info["priority_scheduling_preemption_threshold"] = 4
    assert ServerPriority.from_server_info(info).preemption_threshold == 4


def test_priority_grows_with_turns_wait_and_group_completion() -> None:
    now = [0.0]
    config = SchedulingConfig(priority=True, turn_weight=2, wait_weight_s=1.0, group_weight=8)
    policy = PriorityPolicy(config, clock=lambda: now[0])
    assert policy.urgency("a", "g", 0, 4) == 0
    now[0] = 3.0
    assert policy.urgency("a", "g", 1, 4) == 2 + 3
    policy.finished("b", "g")
    policy.finished("c", "g")
    assert policy.urgency("a", "g", 1, 4) == 2 + 3 + 4  # half the group done: + 8 * 2/4


def test_admission_backs_off_on_kv_pressure_and_grows_back() -> None:
    control = AdmissionControl(SchedulingConfig(admission=True, admission_step=10), ceiling=100)
    assert control.limit == 100
    hot = [{"token_usage": 0.97, "num_waiting_reqs": 5, "queues": {"retracted": 0}}]
    assert control.update(hot) == 70
    assert control.update(hot) == 49
    retracting = [{"token_usage": 0.5, "num_waiting_reqs": 5, "queues": {"retracted": 2}}]
    assert control.update(retracting) == 34
    calm = [{"token_usage": 0.3, "num_waiting_reqs": 0, "queues": {"retracted": 0}}]
    assert control.update(calm) == 44
    for _ in range(10):
        control.update(calm)
    assert control.limit == 100  # never above the configured concurrency


async def test_priority_is_sent_by_turn_only_to_a_priority_server(tokenizer: Any) -> None:
    workload = Workload(prompts=2, n=2, min_turns=3, max_turns=3, tokens_per_turn=24)
    server = _server(tokenizer, ServerScheduling(enabled=True))
    config = SchedulingConfig(priority=True, turn_weight=1)
    trajectories = await _run(tokenizer, [server], config, workload)
    assert all(str(t.status) == "completed" for t in trajectories)
    by_turn = {(e["key"], e["turn"]): e["priority"] for e in server.log}
    for item in workload.items:
        assert [by_turn[(item.key, t)] for t in range(3)] == [0, 1, 2]


async def test_priority_is_never_sent_where_disabled_so_nothing_aborts(tokenizer: Any) -> None:
    workload = Workload(prompts=2, n=2, min_turns=2, max_turns=2, tokens_per_turn=24)
    server = _server(tokenizer, ServerScheduling(enabled=False, abort_when_disabled=True))
    trajectories = await _run(tokenizer, [server], SchedulingConfig(priority=True), workload)
    assert all(str(t.status) == "completed" for t in trajectories), trajectories[0].error
    assert {e["priority"] for e in server.log} == {None}


async def test_low_values_first_server_gets_negated_priorities(tokenizer: Any) -> None:
    workload = Workload(prompts=1, n=1, min_turns=3, max_turns=3, tokens_per_turn=24)
    server = _server(tokenizer, ServerScheduling(enabled=True, low_values_first=True))
    await _run(tokenizer, [server], SchedulingConfig(priority=True), workload)
    # the default turn_weight -1 gives 0, -1, -2; a low-values-first server gets 0, 1, 2
    assert [e["priority"] for e in sorted(server.log, key=lambda e: e["turn"])] == [0, 1, 2]


async def test_group_affinity_keeps_a_prompts_samples_on_one_server(tokenizer: Any) -> None:
    workload = Workload(
        prompts=4, n=4, min_turns=1, max_turns=2, tokens_per_turn=16, shared_prompt_words=150
    )
    cached: dict[bool, int] = {}
    for affinity in (False, True):
        servers = [_server(tokenizer, ServerScheduling()) for _ in range(4)]
        scheduling = SchedulingConfig(affinity=True, group_key="group") if affinity else None
        await _run(tokenizer, servers, scheduling, workload)
        placed: dict[str, set[int]] = {}
        for index, server in enumerate(servers):
            for entry in server.log:
                placed.setdefault(entry["key"].rpartition("s")[0], set()).add(index)
        first_turns = [e for s in servers for e in s.log if e["turn"] == 0]
        cached[affinity] = sum(e["cached_tokens"] for e in first_turns)
        if affinity:
            assert all(len(where) == 1 for where in placed.values())  # one server per group
            assert len({next(iter(w)) for w in placed.values()}) == 4  # groups spread out
        else:
            assert any(len(where) > 1 for where in placed.values())
    assert cached[True] > cached[False] * 1.2  # the shared prompt is prefilled once per group


def test_lag_admission_backs_off_while_the_loop_is_late_and_grows_back() -> None:
    config = SchedulingConfig(lag=True, lag_target_ms=20.0, admission_step=10)
    control = LagAdmission(config, ceiling=100)
    assert control.limit == 100
    assert control.update(0.050) == 70  # 50 ms late: over the 20 ms target
    assert control.update(0.021) == 49
    assert control.update(0.015) == 49  # between half the target and the target: hold
    assert control.update(0.002) == 59  # keeping time: grow back by a step
    for _ in range(10):
        control.update(0.0)
    assert control.limit == 100  # never above the configured concurrency
    for _ in range(30):
        control.update(1.0)
    assert control.limit == config.admission_min
    assert control.late_ms[:2] == [50.0, 21.0] and len(control.history) == 44


async def test_the_lag_policy_holds_requests_back_while_the_loop_is_blocked(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Something else in the process blocks the event loop for 60 ms at a time (as a
    burst of replies would); the run's engine limiter shrinks while it does."""
    workload = Workload(prompts=4, n=4, min_turns=2, max_turns=3, tokens_per_turn=48)
    server = _server(tokenizer, ServerScheduling(), decode_per_token_s=0.005)
    config = SchedulingConfig(
        lag=True, lag_target_ms=25.0, admission_min=2, admission_step=1, poll_s=0.02
    )
    applied: list[float] = []
    original = Scheduler.apply_limits

    def spy(self: Scheduler, limiter: OrderedLimiter) -> None:
        original(self, limiter)
        applied.append(limiter.total_tokens)

    monkeypatch.setattr(Scheduler, "apply_limits", spy)

    async def hog() -> None:
        while True:
            time.sleep(0.06)  # noqa: ASYNC251 (blocking the loop is the point)
            await anyio.sleep(0.01)

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            tg.start_soon(hog)
            trajectories = await _run(tokenizer, [server], config, workload)
            tg.cancel_scope.cancel()
    assert all(str(t.status) == "completed" for t in trajectories)
    assert applied and applied[0] < 256  # the first window already saw the loop late
    # down to the floor (a window between two blocks grows it back by one only)
    assert min(applied) <= 3, applied


async def test_admission_follows_the_load_report_of_a_kv_limited_server(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    workload = Workload(prompts=4, n=4, min_turns=2, max_turns=2, tokens_per_turn=48)
    server = _server(tokenizer, ServerScheduling(), kv_tokens=3_000, decode_per_token_s=0.002)
    config = SchedulingConfig(admission=True, admission_min=2, admission_step=2, poll_s=0.01)
    limits: list[int] = []
    original = AdmissionControl.update

    def spy(self: AdmissionControl, loads: Any) -> int:
        limits.append(original(self, loads))
        return limits[-1]

    monkeypatch.setattr(AdmissionControl, "update", spy)
    with anyio.fail_after(120):
        trajectories = await _run(tokenizer, [server], config, workload)
    assert all(str(t.status) == "completed" for t in trajectories)
    assert limits and min(limits) < 256  # it backed off below the configured cap


def test_work_history_predicts_the_turns_left_from_the_prompts_earlier_lengths() -> None:
    history = WorkHistory()
    assert history.expected_remaining("p", 0) is None  # nothing seen anywhere yet
    for turns in (2, 4, 6):
        history.record("p", turns)
    # every earlier trajectory went past 0 turns: (2 + 4 + 6) / 3
    assert history.expected_remaining("p", 0) == 4.0
    # one still running after 3 turns is like those that went past 3: (1 + 3) / 2
    assert history.expected_remaining("p", 3) == 2.0
    assert history.expected_remaining("p", 6) == 1.0  # longer than any seen: one more
    # a prompt never seen borrows every prompt's lengths
    assert history.expected_remaining("new", 0) == 4.0
    assert history.statistics() == {"prompts": 1, "own": 3, "pooled": 1, "none": 1}
    again = WorkHistory.from_dict(json.loads(json.dumps(history.to_dict())))
    assert again.to_dict() == {"p": [2, 4, 6]}
    small = WorkHistory(window=2)
    for turns in (9, 1, 1):
        small.record("p", turns)
    assert small.to_dict() == {"p": [1, 1]}  # only the latest lengths count
    few = WorkHistory(max_prompts=2)
    for key in ("a", "b", "a", "c"):
        few.record(key, 3)
    assert sorted(few.to_dict()) == ["a", "c"]  # b, seen least recently, was let go


def test_history_priority_serves_the_longest_expected_work_first() -> None:
    config = SchedulingConfig(priority=True, history=True, history_weight=2)
    policy = PriorityPolicy(config)
    assert policy.history is not None
    # no history anywhere: the turn rule (fewest turns done first)
    assert policy.urgency("a", "g", 1, prompt_key="short") == -1
    policy.finished("x", "g", 2, "short")
    policy.finished("y", "g", 6, "long")
    assert policy.urgency("b", "g", 0, prompt_key="long") == 12
    assert policy.urgency("c", "g", 0, prompt_key="short") == 4
    assert policy.urgency("b", "g", 4, prompt_key="long") == 4


def test_history_needs_priority() -> None:
    with pytest.raises(UserError, match="priority=True"):
        SchedulingConfig(history=True)


async def test_a_later_run_sends_each_prompts_expected_length_as_its_priority(
    tokenizer: Any,
) -> None:
    # Each prompt's samples all run its own length (spread 0), the same at every step.
    workload = Workload(prompts=4, n=2, min_turns=1, max_turns=4, tokens_per_turn=16,
                        turn_spread=0)  # fmt: skip
    lengths = {item.group: item.turns for item in workload.items}
    assert len(set(lengths.values())) > 1
    server = _server(tokenizer, ServerScheduling(enabled=True))
    config = RolloutConfig(
        sampling=SamplingParams(max_new_tokens=96),
        max_turns=8,
        scheduling=SchedulingConfig(priority=True, history=True, history_key="group"),
    )
    transport = httpx.ASGITransport(app=create_latency_app(server))
    async with SGLangClient(["http://s0"], transport=transport) as client:
        runner = RolloutRunner(client, tokenizer, [lookup], config=config)
        assert runner.work_history is not None
        for step in range(2):
            server.log.clear()
            drawn = replace(workload, step=step)
            rows = drawn.rows()
            for row, item in zip(rows, drawn.items, strict=True):
                row["group"] = item.group
            trajectories = await runner.run(rows)
            assert all(str(t.status) == "completed" for t in trajectories)
    assert runner.work_history.to_dict() == {g: [t, t, t, t] for g, t in lengths.items()}
    # the second step: every request carries 2 x the turns its prompt has left
    for entry in server.log:
        group = entry["key"].rpartition("s")[0]
        assert entry["priority"] == 2 * (lengths[group] - entry["turn"]), entry


async def _requests_until_half_the_groups_complete(
    tokenizer: Any,
    scheduling: SchedulingConfig | None,
    *,
    server: LatencyServer | None = None,
    concurrency: int = 4,
) -> tuple[int, int]:
    """Six groups of four three-turn trajectories through a limit of four requests in
    flight (the client's, or the server's four slots): how many requests the server had
    answered when the third group completed, and in all."""
    workload = Workload(prompts=6, n=4, min_turns=3, max_turns=3, tokens_per_turn=16)
    if server is None:
        server = _server(tokenizer, ServerScheduling(), decode_per_token_s=0.001)
    left: dict[str, int] = {}
    complete: list[int] = []

    def on_result(trajectory: Any) -> None:
        group = workload.items[trajectory.prompt_index].group
        left[group] = left.get(group, 4) - 1
        if left[group] == 0:
            complete.append(len(server.log))

    with anyio.fail_after(120):
        trajectories = await _run(
            tokenizer, [server], scheduling, workload, concurrency=concurrency, on_result=on_result
        )
    assert all(str(t.status) == "completed" for t in trajectories)
    assert len(complete) == 6
    return complete[2], len(server.log)


async def test_oldest_groups_first_completes_groups_one_after_another(tokenizer: Any) -> None:
    """First come, first served, 24 trajectories queue again behind each other at every
    turn, so they advance in step and no group completes before the last round; served by
    their group's start order, the first groups finish while the last have barely begun.
    The server answers the same 72 requests either way."""
    fifo, total = await _requests_until_half_the_groups_complete(tokenizer, None)
    oldest, total_oldest = await _requests_until_half_the_groups_complete(
        tokenizer, SchedulingConfig(oldest=True, group_key="group")
    )
    assert total == total_oldest == 72
    assert fifo >= 2 * 24  # every trajectory's first two turns came first (60 measured)
    assert oldest <= 0.75 * fifo, (oldest, fifo)  # 39 against 60 measured; 36 at best


def test_under_oldest_the_priority_is_the_groups_age() -> None:
    """With ``oldest`` the priority is the group's band of age among the groups that have
    not completed: ``oldest_levels`` for the oldest, 0 for the youngest; a completed group
    leaves the count. With a history the prediction stays the priority."""

    @dataclass
    class Sample:
        uid: str
        group_id: str
        num_turns: int = 0
        status: str = "completed"
        prompt: Any = None

    config = SchedulingConfig(priority=True, oldest=True, oldest_levels=9)
    scheduler = Scheduler(config, engine=None, group_size=2)
    samples = [Sample(f"{g}s{i}", f"g{g}") for g in range(20) for i in range(2)]
    for sample in samples:  # twenty groups ask, in order
        scheduler.group_rank(sample)
    bands = [scheduler.age_band(sample) for sample in samples[::2]]
    assert bands == [9, 9, 8, 8, 7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0]
    for sample in samples[:10]:  # the five oldest groups complete
        scheduler.finished(sample)
    bands = [scheduler.age_band(sample) for sample in samples[10::2]]
    assert bands == [9, 9, 8, 7, 7, 6, 5, 5, 4, 3, 3, 2, 1, 1, 0]
    few = Scheduler(config, engine=None)
    three = [Sample(f"u{g}", f"h{g}") for g in range(3)]
    for sample in three:
        few.group_rank(sample)
    assert [few.age_band(sample) for sample in three] == [9, 6, 3]

    policy = PriorityPolicy(config)
    assert [policy.urgency("a", "g", 3, age_band=b) for b in (9, 4, 0, 12, -1)] == [
        9, 4, 0, 9, 0,
    ]  # fmt: skip
    assert policy.urgency("a", "g", 3) == -3  # no band known: turns done, as before
    history = WorkHistory()
    history.record("p", 5)
    with_history = SchedulingConfig(priority=True, history=True, oldest=True)
    ranked = PriorityPolicy(with_history, history=history)
    assert ranked.urgency("b", "g", 1, prompt_key="p", age_band=9) == 2 * 4
    with pytest.raises(UserError, match="oldest_levels"):
        SchedulingConfig(oldest=True, oldest_levels=0)


SLOT_TOKEN_S = 0.005
"""Decode time per token when the server's slots are the queue: a request holds a slot for
80 ms, long next to the client's own work even on a loaded machine (at 1 ms the order the
client sent in, not the server's queue, decided the result under load)."""


async def test_the_server_serves_the_oldest_groups_first_when_told(tokenizer: Any) -> None:
    """Every request goes out at once (no client limit), and the server's four slots are
    the queue. Told each group's age as its priority, a priority-scheduling server
    completes the first groups while the last have barely begun; its priorities stay in
    [0, 9], within the preemption threshold, so nothing is preempted."""

    def slots() -> LatencyServer:
        return _server(
            tokenizer, ServerScheduling(enabled=True), decode_per_token_s=SLOT_TOKEN_S, capacity=4
        )

    fifo, total = await _requests_until_half_the_groups_complete(
        tokenizer, None, server=slots(), concurrency=256
    )
    told = slots()
    oldest, total_oldest = await _requests_until_half_the_groups_complete(
        tokenizer,
        SchedulingConfig(priority=True, oldest=True, group_key="group"),
        server=told,
        concurrency=256,
    )
    assert total == total_oldest == 72
    priorities = [entry["priority"] for entry in told.log]
    assert min(priorities) >= 0 and max(priorities) == 9
    assert told.preemptions == 0
    assert oldest <= 0.75 * fifo, (oldest, fifo)  # 40 against 60 measured


async def test_the_age_bands_stay_within_the_servers_preemption_threshold(
    tokenizer: Any,
) -> None:
    """A server that preempts at a difference above 3 gets bands 0 to 3 only: its queue is
    reordered, nothing is preempted."""
    server = _server(
        tokenizer,
        ServerScheduling(enabled=True, preemption_threshold=3),
        decode_per_token_s=SLOT_TOKEN_S,
        capacity=4,
    )
    _, total = await _requests_until_half_the_groups_complete(
        tokenizer,
        SchedulingConfig(priority=True, oldest=True, group_key="group"),
        server=server,
        concurrency=256,
    )
    assert total == 72
    assert {entry["priority"] for entry in server.log} == {0, 1, 2, 3}
    assert server.preemptions == 0


def test_policies_by_name_as_the_command_line_gives_them() -> None:
    assert SchedulingConfig.from_names("none") is None
    assert SchedulingConfig.from_names(" ") is None
    config = SchedulingConfig.from_names("history, affinity", history_key="prompt_id")
    assert config is not None
    assert (config.priority, config.history, config.affinity, config.admission) == (
        True,
        True,
        True,
        False,
    )
    assert config.history_key == "prompt_id"
    oldest = SchedulingConfig.from_names("oldest")
    assert oldest is not None and oldest.oldest and oldest.enabled and not oldest.priority
    lag = SchedulingConfig.from_names("lag")
    assert lag is not None and lag.lag and lag.enabled and not lag.admission
    with pytest.raises(UserError, match="unknown scheduling policy fifo: choose from"):
        SchedulingConfig.from_names("priority,fifo")
