"""The benchmark's inputs as plain values: server cost model, tool latencies, workload, and
the spec each driver's worker process runs from.

Everything a run depends on is deterministic: a tool call's latency is a function of the
call's key and the seed, and each trajectory's number of turns and tokens is written into
its prompt. So every driver (toolrollout, lock-step, verifiers) sees exactly the same work,
and the harness can compute each trajectory's critical path without trusting the drivers.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import sys
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from toolrollout._exceptions import UserError

from ._metrics import group_of

__all__ = [
    "DIRECTIVE_RE",
    "FINISH_TOOLS",
    "GC_THRESHOLD_RE",
    "GROUP_DIRECTIVE_RE",
    "PRIORITY_DISABLED_MESSAGE",
    "UNPACED",
    "DriverSpec",
    "LatencyModel",
    "PriorityRefused",
    "ServerScheduling",
    "ToolLatency",
    "WorkerFlags",
    "Workload",
    "WorkloadGroup",
    "WorkloadItem",
    "parse_directive",
    "parse_group_directive",
    "worker_flags",
]

DIRECTIVE_RE = re.compile(
    r"bench-task (?P<key>[\w.-]+) turns=(?P<turns>\d+) tokens=(?P<tokens>\d+)"
)
"""How a prompt tells the latency-model server what to answer (see :class:`Workload`)."""

GROUP_DIRECTIVE_RE = re.compile(
    r"bench-group (?P<key>[\w.-]+) turns=(?P<turns>\d+(?:,\d+)*) tokens=(?P<tokens>\d+)"
)
"""The same for a GRPO group whose samples share one prompt (``Workload.grouped``): the
turns of each of its samples, in sample order."""


UNPACED = "unpaced"
"""A bench mode's pseudo-policy (``toolrollout:unpaced``), not a scheduling policy: that
mode's worker turns loop pacing off (:mod:`toolrollout._pacing`) to measure what it does."""

FINISH_TOOLS = "finishtools"
"""Another pseudo-policy (``oversample:finishtools``): the batch lets the tool calls running
at its target finish (``RolloutConfig.tools_at_target="finish"``) instead of cancelling them."""

GC_THRESHOLD_RE = re.compile(r"gc(?P<allocations>[1-9]\d*)")
"""Another pseudo-policy, ``gcN`` (``toolrollout:gc20000``): that mode's worker collects the
youngest generation after N allocations, as ``generate --gc-threshold N`` does."""


@dataclass(frozen=True, slots=True)
class WorkerFlags:
    """What a mode's names ask of its worker process."""

    scheduling: tuple[str, ...]
    """The scheduling policies (``SchedulingConfig.from_names``), in the order given."""
    paced: bool = True
    """Loop pacing on (off with :data:`UNPACED`)."""
    gc_threshold: int | None = None
    """The youngest generation's collector threshold (``gcN``), or the default."""
    finish_tools: bool = False
    """Tool calls running at a batch target finish first (:data:`FINISH_TOOLS`)."""


def worker_flags(policies: tuple[str, ...]) -> WorkerFlags:
    """A mode's names split into its scheduling policies and its worker's settings."""
    threshold = None
    scheduling: list[str] = []
    for name in policies:
        match = GC_THRESHOLD_RE.fullmatch(name)
        if match:
            threshold = int(match["allocations"])
        elif name not in (UNPACED, FINISH_TOOLS):
            scheduling.append(name)
    return WorkerFlags(
        tuple(scheduling), UNPACED not in policies, threshold, FINISH_TOOLS in policies
    )


@dataclass(frozen=True, slots=True)
class LatencyModel:
    """What one generation costs on the simulated server.

    A request holds one of ``capacity`` batch slots (continuous batching: a finished
    request frees its slot at once) for ``prefill_per_token_s`` per uncached prompt token
    plus ``decode_per_token_s`` per generated token. The per-token cost does not grow with
    the batch, which is how a memory-bound decode behaves until the batch is full.
    """

    capacity: int = 256
    prefill_per_token_s: float = 0.00002
    decode_per_token_s: float = 0.002
    kv_tokens: int = 0
    """KV-cache budget in tokens (SGLang's ``--max-total-tokens``); 0: unlimited. Running
    requests' contexts and the prefix cache occupy it; past it the server evicts the cache,
    then retracts running requests, which wait again and re-prefill."""

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise UserError(f"capacity must be at least 1, got {self.capacity}")
        if self.prefill_per_token_s < 0 or self.decode_per_token_s < 0:
            raise UserError("prefill and decode costs must not be negative")
        if self.kv_tokens < 0:
            raise UserError(f"kv_tokens must not be negative, got {self.kv_tokens}")

    @property
    def kv_check_seconds(self) -> float:
        """How often growing decodes are checked against ``kv_tokens``: every 8 decode
        steps, at most 100 times a second (SGLang checks every step; a timer per step
        would cost the stand-in more than the client it measures)."""
        return max(self.decode_per_token_s * 8, 0.01)

    @property
    def kv_overshoot_tokens(self) -> int:
        """KV the server may hold past ``kv_tokens`` until the next check: every slot's
        request decoding unchecked for one check interval. 0 without a budget."""
        if not self.kv_tokens or self.decode_per_token_s <= 0:
            return 0
        return self.capacity * math.ceil(self.kv_check_seconds / self.decode_per_token_s)


PRIORITY_DISABLED_MESSAGE = (
    "Using priority is disabled for this server. Please send a new request without a priority."
)
"""SGLang's abort message for a priority sent to a server without priority scheduling."""


class PriorityRefused(UserError):
    """A request carried a priority to a server started with --abort-on-priority-when-disabled."""


@dataclass(frozen=True, slots=True)
class ServerScheduling:
    """SGLang's priority-scheduling server arguments (:meth:`to_args` names each one), with
    SGLang's defaults. A waiting request preempts a running one only when their priorities
    differ by more than ``preemption_threshold``; with ``abort_when_disabled`` a priority
    sent to a server without the feature is refused (503), not ignored;
    ``default_priority`` None is the lowest priority there is."""

    enabled: bool = False
    low_values_first: bool = False
    preemption_threshold: int = 10
    abort_when_disabled: bool = False
    default_priority: int | None = None
    preemption: bool = True
    """False is ``--disable-priority-preemption``: priorities order the queue only."""

    def to_args(self) -> list[str]:
        """Command-line options of the latency-model server for these settings."""
        args = [f"--priority-scheduling-preemption-threshold={self.preemption_threshold}"]
        if self.enabled:
            args.append("--enable-priority-scheduling")
        if self.low_values_first:
            args.append("--schedule-low-priority-values-first")
        if self.abort_when_disabled:
            args.append("--abort-on-priority-when-disabled")
        if self.default_priority is not None:
            args.append(f"--default-priority-value={self.default_priority}")
        if not self.preemption:
            args.append("--disable-priority-preemption")
        return args

    def resolve(self, priority: int | None) -> int:
        """SGLang's ``_set_or_validate_priority``: the default, the refusal, or ignore."""
        if not self.enabled:
            if priority is not None and self.abort_when_disabled:
                raise PriorityRefused(PRIORITY_DISABLED_MESSAGE)
            return 0  # ignored: every request is equal, the queue stays FCFS
        if priority is not None:
            return priority
        if self.default_priority is not None:
            return self.default_priority
        return sys.maxsize if self.low_values_first else -sys.maxsize - 1

    def rank(self, priority: int, entry: float, seq: int) -> tuple[float, float]:
        """Sort key of the wait queue; smaller is served first (``seq``: arrival order)."""
        if not self.enabled:
            return (0.0, float(seq))
        sign = 1 if self.low_values_first else -1
        return (float(priority * sign), entry)

    def victim_order(self, priority: int, entry: float) -> tuple[float, float]:
        """SGLang's preemption order: lowest priority first, then the latest to queue."""
        sign = 1 if self.low_values_first else -1
        return (float(priority * -sign), -entry)

    def outranks(self, new: int, running: int) -> bool:
        """Whether a waiting request's priority may preempt a running one's."""
        sign = 1 if self.low_values_first else -1
        return (new - running) * -sign > self.preemption_threshold


@dataclass(frozen=True, slots=True)
class ToolLatency:
    """A tool-latency distribution, sampled deterministically per call key.

    ``fixed`` always takes ``median`` seconds; ``lognormal`` has that median and log-space
    standard deviation ``sigma`` (sigma 1.0 puts the 99.9th percentile about 22x above the
    median: a heavy tail), capped at ``cap`` seconds so one draw cannot stall a run.
    """

    kind: Literal["fixed", "lognormal"] = "lognormal"
    median: float = 0.2
    sigma: float = 1.0
    cap: float = 30.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "lognormal"):
            raise UserError(f"tool latency kind must be fixed or lognormal, got {self.kind!r}")
        if self.median < 0 or self.sigma < 0 or self.cap < 0:
            raise UserError("tool latency median, sigma and cap must not be negative")

    def sample(self, key: str) -> float:
        """Seconds the tool call ``key`` takes (the same for every driver and run)."""
        if self.kind == "fixed" or self.median == 0:
            return min(self.median, self.cap)
        digest = hashlib.blake2b(f"{self.seed}:{key}".encode(), digest_size=8).digest()
        rng = random.Random(int.from_bytes(digest, "big"))
        return min(rng.lognormvariate(math.log(self.median), self.sigma), self.cap)

    def to_args(self) -> list[str]:
        """Command-line options of the tool service for this distribution."""
        return [f"--latency-{f.name}={getattr(self, f.name)}" for f in fields(self)]


@dataclass(frozen=True, slots=True)
class WorkloadItem:
    """One trajectory's script: how many model turns and how many tokens per turn."""

    key: str
    turns: int
    tokens: int
    shared: str = ""
    """The GRPO group's shared problem text, written before the script (may be empty)."""

    @property
    def group(self) -> str:
        """The prompt this sample belongs to (``p3`` for ``p3s7``)."""
        return group_of(self.key)

    def prompt(self) -> list[dict[str, Any]]:
        return _user_prompt(f"bench-task {self.key} turns={self.turns} tokens={self.tokens}",
                            self.shared)  # fmt: skip

    def tool_keys(self) -> list[str]:
        """Keys of the tool calls this trajectory makes (one per turn but the last)."""
        return [f"{self.key}.{t}" for t in range(self.turns - 1)]


@dataclass(frozen=True, slots=True)
class WorkloadGroup:
    """A GRPO group whose samples share one prompt, as a trainer's ``n`` samples do.

    The prompt cannot say which sample a request belongs to, so the latency-model server
    decides it as sampling would: the k-th first turn of the group that arrives becomes
    sample k (:meth:`sample`), and its first answer names it (the tool call's key) for the
    turns after. Every driver sees the same samples; only which copy runs which one depends
    on arrival order, and the copies are alike until then.
    """

    key: str
    turns: tuple[int, ...]
    """Each sample's number of model turns, in sample order."""
    tokens: int
    shared: str = ""

    def sample(self, index: int) -> WorkloadItem:
        """Sample ``index``'s script (``p3s5`` for sample 5 of ``p3``)."""
        return WorkloadItem(f"{self.key}s{index}", self.turns[index], self.tokens, self.shared)

    def prompt(self) -> list[dict[str, Any]]:
        turns = ",".join(str(t) for t in self.turns)
        return _user_prompt(f"bench-group {self.key} turns={turns} tokens={self.tokens}",
                            self.shared)  # fmt: skip


def _user_prompt(directive: str, shared: str) -> list[dict[str, Any]]:
    """A benchmark prompt: the group's shared problem text (if any), then the directive."""
    return [{"role": "user", "content": f"{shared}\n\n{directive}" if shared else directive}]


@dataclass(frozen=True, slots=True)
class Workload:
    """``prompts`` x ``n`` trajectories; turns drawn uniformly from ``min_turns..max_turns``
    (or, with ``turn_spread``, from near each prompt's own typical length).

    Every trajectory calls one tool per turn except its last, whose answer ends it.
    """

    prompts: int = 64
    n: int = 16
    min_turns: int = 2
    max_turns: int = 6
    tokens_per_turn: int = 48
    seed: int = 0
    shared_prompt_words: int = 0
    """Words of problem text shared by the ``n`` samples of a prompt (GRPO's shared prompt;
    about 1.3 tokens a word); 0: the samples share only the system prompt."""
    turn_spread: int = -1
    """-1 (the published workload): every sample draws its turns on its own, so nothing about
    a prompt predicts its samples' lengths. 0 or more: each prompt has a typical length of its
    own (drawn once, the same at every step) and its samples draw within this many turns of
    it, as in RL where a problem's difficulty decides how long its rollouts run."""
    step: int = 0
    """Which training step's draws: the same prompts, each sample drawn again (step 0 is the
    published draw)."""
    grouped: bool = False
    """False (published): each sample's prompt names its own script, so every row is a
    prompt of its own. True: the ``n`` samples of a prompt share one prompt, as a GRPO
    trainer's do (:class:`WorkloadGroup`); toolrollout runs ``prompts`` rows with
    ``n`` samples each, and a batch target counts whole groups. The same draws either way."""
    items: tuple[WorkloadItem, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.prompts < 1 or self.n < 1:
            raise UserError("prompts and n must be at least 1")
        if not 1 <= self.min_turns <= self.max_turns:
            raise UserError("need 1 <= min_turns <= max_turns")
        if self.tokens_per_turn < 1:
            raise UserError("tokens_per_turn must be at least 1")
        if self.shared_prompt_words < 0:
            raise UserError("shared_prompt_words must not be negative")
        if self.turn_spread < -1 or self.step < 0:
            raise UserError("turn_spread must be -1 or more and step not negative")
        rng = random.Random(self.seed if self.step == 0 else f"{self.seed}-step-{self.step}")
        typical = random.Random(f"{self.seed}-typical")  # a prompt's length, every step
        items = []
        for p in range(self.prompts):
            shared = _problem_text(p, self.shared_prompt_words)
            low, high = self.min_turns, self.max_turns
            if self.turn_spread >= 0:
                centre = typical.randint(self.min_turns, self.max_turns)
                low = max(self.min_turns, centre - self.turn_spread)
                high = min(self.max_turns, centre + self.turn_spread)
            for s in range(self.n):
                turns = rng.randint(low, high)
                items.append(WorkloadItem(f"p{p}s{s}", turns, self.tokens_per_turn, shared))
        object.__setattr__(self, "items", tuple(items))

    @property
    def trajectories(self) -> int:
        return self.prompts * self.n

    def groups(self) -> list[WorkloadGroup]:
        """The prompts' groups, their samples' turns in sample order."""
        return [
            WorkloadGroup(
                f"p{p}",
                tuple(item.turns for item in self.items[p * self.n : (p + 1) * self.n]),
                self.tokens_per_turn,
                self.items[p * self.n].shared,
            )
            for p in range(self.prompts)
        ]

    def rows(self) -> list[dict[str, Any]]:
        """Prompt rows, one per trajectory: each sample's own script, or, when
        :attr:`grouped`, its group's shared prompt (the ``n`` rows of a group alike)."""
        if self.grouped:
            return [{"messages": g.prompt()} for g in self.groups() for _ in range(self.n)]
        return [{"messages": item.prompt()} for item in self.items]

    def prompt_rows(self) -> list[dict[str, Any]]:
        """The rows to run with ``n`` samples each: one per group when :attr:`grouped`,
        else one per trajectory (run with ``n=1``)."""
        if self.grouped:
            return [{"messages": g.prompt()} for g in self.groups()]
        return self.rows()

    @property
    def max_new_tokens(self) -> int:
        """Every mode's cap on a model turn: room for the scripted turn twice over."""
        return self.tokens_per_turn * 2 + 32

    @property
    def samples_per_row(self) -> int:
        """The ``n`` to run :meth:`prompt_rows` with."""
        return self.n if self.grouped else 1

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("items", None)
        return data


def _problem_text(prompt: int, words: int) -> str:
    """Deterministic problem text of ``words`` words for prompt ``prompt`` ("" for 0)."""
    if words <= 0:
        return ""
    rng = random.Random(f"problem-{prompt}")
    vocabulary = ("record", "value", "table", "column", "sum", "index", "filter", "range")
    body = " ".join(rng.choice(vocabulary) for _ in range(words))
    return f"Problem {prompt}: {body}."


def parse_directive(text: str) -> WorkloadItem | None:
    """The script in a prompt's user message, or None for an ordinary prompt."""
    match = DIRECTIVE_RE.search(text)
    if match is None:
        return None
    return WorkloadItem(match["key"], int(match["turns"]), int(match["tokens"]))


def parse_group_directive(text: str) -> WorkloadGroup | None:
    """The group script in a shared prompt's user message, or None."""
    match = GROUP_DIRECTIVE_RE.search(text)
    if match is None:
        return None
    turns = tuple(int(t) for t in match["turns"].split(","))
    return WorkloadGroup(match["key"], turns, int(match["tokens"]))


@dataclass(frozen=True, slots=True)
class DriverSpec:
    """Everything a worker needs, JSON-friendly."""

    mode: str
    engine_urls: tuple[str, ...]
    tool_url: str
    workload: dict[str, Any]
    tokenizer: str
    concurrency: int = 4096
    drift_check: bool = True
    batch_fraction: float = 0.875
    """``oversample`` mode: the share of the trajectories the batch target asks for."""
    policies: tuple[str, ...] = ()
    """toolrollout's client-side scheduling policies for this mode (``priority``,
    ``admission``, ``affinity``, ``history``); see :mod:`toolrollout.engines._scheduling`."""
    previous_steps: int = 0
    """toolrollout modes: training steps run before the measured one (the workload's
    ``step``), with the same runner, the services reset between; see ``BenchConfig``."""
