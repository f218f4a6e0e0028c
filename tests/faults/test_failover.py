"""Failover of pinned trajectories and the retry budget in time (issue 23, item 3).

The servers are ``httpx.MockTransport`` handlers (the client's documented test seam) that
refuse connections the way a dead server does; the clock is the virtual one of
``tests/_virtual_time.py``, so a 35 s outage and a 60 s budget take no wall time and the
times asserted are exact. The real-process forms are in ``test_chaos_engines.py``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from tests._virtual_time import run_in_virtual_time

from toolrollout._exceptions import EngineUnavailable
from toolrollout.engines import ENGINE_RETRY, GenerateRequest, RetryPolicy, SGLangClient
from toolrollout.rollout import RolloutConfig, RolloutRunner
from toolrollout.tools import calculator_tool

S0, S1 = "http://s0:30000", "http://s1:30000"
NO_WAIT = RetryPolicy(max_attempts=6, initial_backoff=0.0, max_backoff=0.0, jitter=0.0)
FIXTURE = Path(__file__).parents[1] / "engines" / "fixtures" / "sglang_generate_stop_eos.json"


def body_for(rid: str, ids: list[int]) -> dict[str, Any]:
    template = json.loads(FIXTURE.read_text())
    meta = template["meta_info"]
    meta.update(id=rid, completion_tokens=len(ids), output_token_logprobs_length=len(ids))
    meta["output_token_logprobs"] = [[-0.5, i, None] for i in ids]
    meta["finish_reason"] = {"type": "stop", "matched": ids[-1]}
    template["output_ids"] = ids
    return dict(template)


def host(request: httpx.Request) -> str:
    return f"http://{request.url.host}:{request.url.port}"


def req(rid: str, session: str | None = None) -> GenerateRequest:
    return GenerateRequest(input_ids=(1, 2, 3), rid=rid, session_id=session)


# ------------------------------------------------------------------ failover


async def test_a_pinned_session_moves_after_repeated_failures() -> None:
    down: set[str] = set()
    hits: Counter[str] = Counter()

    async def handler(request: httpx.Request) -> httpx.Response:
        hits[host(request)] += 1
        if host(request) in down:
            raise httpx.ConnectError("connection refused")
        rid = json.loads(request.content)["rid"]
        return httpx.Response(200, json=body_for(rid, [11, 151645]))

    transport = httpx.MockTransport(handler)
    async with SGLangClient((S0, S1), transport=transport, retry=NO_WAIT) as client:
        first = await client.generate(req("a", session="traj"))
        pinned = first.server_url
        assert pinned is not None
        other = S1 if pinned == S0 else S0
        down.add(pinned)  # killed for good
        hits.clear()
        moved = await client.generate(req("b", session="traj"))
        assert moved.server_url == other  # moved, not failed
        assert hits == {pinned: 3, other: 1}  # failover_after=3 attempts in a row, then move
        stats = client.stats()
        assert stats.moves == 1 and stats.failures == 0
        assert {s.url: (s.down, s.moved_away) for s in stats.servers}[pinned] == (True, 1)
        # The session is pinned to the healthy server now: no further attempt on the dead one.
        hits.clear()
        await client.generate(req("c", session="traj"))
        assert hits == {other: 1}


async def test_failover_can_be_switched_off() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        if host(request) == S0:
            raise httpx.ConnectError("connection refused")
        return httpx.Response(200, json=body_for(json.loads(request.content)["rid"], [7, 9]))

    transport = httpx.MockTransport(handler)
    async with SGLangClient(
        (S0, S1), transport=transport, retry=NO_WAIT, failover_after=None
    ) as client:
        client._router.bind("traj", S0)  # pinned to the dead server before it died
        with pytest.raises(EngineUnavailable, match="gave up after 6 attempts"):
            await client.generate(req("x", session="traj"))
        assert client.stats().moves == 0


def test_a_down_server_gets_new_sessions_again_after_its_cooldown() -> None:
    state = {"dead": True}
    hits: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        hits.append(host(request))
        if host(request) == S0 and state["dead"]:
            raise httpx.ConnectError("connection refused")
        return httpx.Response(200, json=body_for(json.loads(request.content)["rid"], [7, 9]))

    async def main() -> None:
        transport = httpx.MockTransport(handler)
        async with SGLangClient(
            (S0, S1), transport=transport, retry=NO_WAIT, failover_cooldown=10.0
        ) as client:
            for i in range(3):  # three sessions pinned to S0 (refused -> S1, S0 counted)
                client._router.bind(f"p{i}", S0)
                await client.generate(req(f"r{i}", session=f"p{i}"))
            assert [s.down for s in client.stats().servers] == [True, False]
            hits.clear()
            for i in range(4):  # new sessions avoid S0 while it is down
                await client.generate(req(f"n{i}", session=f"n{i}"))
            assert set(hits) == {S1}
            state["dead"] = False
            await anyio.sleep(10.5)  # the cooldown passes: S0 is tried again, and answers
            hits.clear()
            for i in range(4):
                await client.generate(req(f"m{i}", session=f"m{i}"))
            assert S0 in hits
            assert [s.down for s in client.stats().servers] == [False, False]

    run_in_virtual_time(main)


def test_moves_are_recorded_on_the_trajectory_tokens_unchanged(demo_tokenizer: Any) -> None:
    """Two servers; the one holding the trajectories dies after their first turn."""
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "4 * 341"}}\n'
    call += "</tool_call><|im_end|>"
    turns = [demo_tokenizer.encode(t, add_special_tokens=False) for t in (call, "1364<|im_end|>")]
    dead: set[str] = set()
    answered: list[tuple[str, int]] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/generate":  # the runner's info() at its first call
            return httpx.Response(404)
        body = json.loads(request.content)
        turn = int(re.search(r"-t(\d+)-", body["rid"]).group(1))  # type: ignore[union-attr]
        if host(request) in dead:
            raise httpx.ConnectError("connection refused")
        if turn == 0:
            dead.add(host(request))  # this server dies once it has answered a first turn
        answered.append((host(request), len(body["input_ids"])))
        return httpx.Response(200, json=body_for(body["rid"], turns[turn]))

    prompt = {"messages": [{"role": "user", "content": "Multiply 4 by 341."}], "answer": "1364"}

    async def main() -> list[Any]:
        transport = httpx.MockTransport(handler)
        async with SGLangClient((S0, S1), transport=transport, retry=NO_WAIT) as client:
            config = RolloutConfig(n=1, max_turns=3, concurrency=1)
            runner = RolloutRunner(client, demo_tokenizer, [calculator_tool()], config=config)
            return await runner.run([prompt])

    [trajectory] = anyio.run(main)
    assert not trajectory.failed, trajectory.error
    assert trajectory.num_turns == 2
    first_server = answered[0][0]
    second_server = answered[-1][0]
    assert first_server != second_server
    assert trajectory.metrics["engine_moves"] == [
        {"turn": 2, "from": first_server, "to": second_server}
    ]
    # The second turn carried the whole sequence (prompt + turn 1 + tool delta) to the new
    # server, so the token record is exactly what an unmoved run would have.
    model = [s.ids for s in trajectory.spans if s.kind == "model"]
    assert model == [tuple(t) for t in turns]
    assert answered[-1][1] == len(trajectory.prompt_ids) + len(trajectory.response_ids) - len(
        turns[1]
    )


# --------------------------------------------------------------- budget in time


def outage_run(seconds: float, retry: RetryPolicy | None) -> tuple[str, float, int]:
    """One request against a server that refuses connections for ``seconds``."""
    attempts: list[float] = []

    async def main() -> tuple[str, float, int]:
        async def handler(request: httpx.Request) -> httpx.Response:
            attempts.append(anyio.current_time())
            if anyio.current_time() < seconds:
                raise httpx.ConnectError("connection refused")
            return httpx.Response(200, json=body_for(json.loads(request.content)["rid"], [5, 6]))

        transport = httpx.MockTransport(handler)
        options: dict[str, Any] = {} if retry is None else {"retry": retry}
        async with SGLangClient(S0, transport=transport, **options) as client:
            try:
                await client.generate(req("r"))
                outcome = "ok"
            except EngineUnavailable as exc:
                outcome = str(exc)
        return outcome, anyio.current_time(), len(attempts)

    return run_in_virtual_time(main)


def test_the_default_budget_rides_out_a_35_s_restart() -> None:
    outcome, elapsed, attempts = outage_run(35.0, None)
    assert outcome == "ok"
    # Found within one capped wait (4 s + jitter) of the server coming back.
    assert 35.0 <= elapsed <= 35.0 + ENGINE_RETRY.max_backoff + 1e-6
    assert attempts < ENGINE_RETRY.max_attempts


def test_the_old_attempt_only_budget_fails_the_same_restart() -> None:
    """The policy the issue reports: 5 attempts, about 7.5 s, then every request fails."""
    outcome, elapsed, _ = outage_run(35.0, RetryPolicy(max_attempts=5))
    assert "gave up after 5 attempts" in outcome
    assert elapsed < 10.0


def test_a_server_that_stays_down_fails_at_the_time_budget() -> None:
    outcome, elapsed, attempts = outage_run(1e9, None)
    assert "gave up after" in outcome and "in 60.0 s" in outcome
    assert elapsed == pytest.approx(60.0)  # the last wait is cut to end at the budget
    assert 10 < attempts <= ENGINE_RETRY.max_attempts


def test_the_budget_counts_from_the_first_failure() -> None:
    policy = RetryPolicy(max_attempts=100, initial_backoff=1.0, max_backoff=1.0, jitter=0.0,
                         budget_s=5.0)  # fmt: skip
    outcome, elapsed, attempts = outage_run(1e9, policy)
    assert "gave up after 6 attempts in 5.0 s" in outcome
    assert elapsed == pytest.approx(5.0) and attempts == 6


def test_budget_is_checked() -> None:
    from toolrollout.exceptions import UserError

    with pytest.raises(UserError, match="budget_s"):
        RetryPolicy(budget_s=-1.0)
