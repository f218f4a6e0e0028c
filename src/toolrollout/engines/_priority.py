"""The ``priority`` and ``history`` scheduling policies (see :mod:`._scheduling`)."""

from __future__ import annotations

import json
import math
import os
import time
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolrollout._exceptions import UserError

from ._scheduling_config import SchedulingConfig

__all__ = ["PriorityPolicy", "ServerPriority", "WorkHistory"]


@dataclass(frozen=True, slots=True)
class ServerPriority:
    """What a server's ``/server_info`` says about priority scheduling."""

    enabled: bool
    low_values_first: bool = False
    preemption_threshold: int | None = None
    """``priority_scheduling_preemption_threshold``: a waiting request preempts a running
    one whose priority is lower by more than this (None: not reported)."""

    @classmethod
    def from_server_info(cls, info: dict[str, Any]) -> ServerPriority:
        """Read SGLang's server args, or vLLM's ``vllm_config`` (``--scheduling-policy
        priority``: lower values first); anything missing means the feature is off."""
        vllm = info.get("vllm_config")
        if isinstance(vllm, dict):
            scheduler = vllm.get("scheduler_config")
            policy = scheduler.get("policy") if isinstance(scheduler, dict) else None
            return cls(enabled=policy == "priority", low_values_first=True)
        threshold = info.get("priority_scheduling_preemption_threshold")
        return cls(
            enabled=info.get("enable_priority_scheduling") is True,
            low_values_first=info.get("schedule_low_priority_values_first") is True,
            preemption_threshold=threshold if type(threshold) is int else None,
        )


class WorkHistory:
    """How many model turns each prompt's trajectories took, kept from one run to the next.

    A problem's difficulty decides much of how long its rollouts run, and a trainer samples
    its prompts again. Per prompt the last ``window`` lengths are kept, for the
    ``max_prompts`` most recent prompts, and over all prompts the last ``pooled_window``.
    """

    def __init__(
        self, window: int = 32, pooled_window: int = 4096, max_prompts: int = 200_000
    ) -> None:
        if window < 1 or pooled_window < 1 or max_prompts < 1:
            raise UserError("WorkHistory's window, pooled_window and max_prompts must be >= 1")
        self.window = window
        self.max_prompts = max_prompts
        self._turns: OrderedDict[str, list[int]] = OrderedDict()
        self._pooled: deque[int] = deque(maxlen=pooled_window)
        self.own = 0
        """Predictions made from the prompt's own history."""
        self.pooled = 0
        """Predictions made from all prompts' history (the prompt had none)."""
        self.none = 0
        """Requests for which there was no history at all."""

    def __len__(self) -> int:
        """Prompts with a history."""
        return len(self._turns)

    def record(self, key: str, turns: int) -> None:
        """A trajectory of prompt ``key`` ended after ``turns`` model turns."""
        seen = self._turns.get(key)
        if seen is None:
            seen = self._turns[key] = []
            if len(self._turns) > self.max_prompts:
                self._turns.popitem(last=False)  # the prompt seen least recently
        else:
            self._turns.move_to_end(key)
        seen.append(turns)
        if len(seen) > self.window:
            del seen[0]
        self._pooled.append(turns)

    def expected_remaining(self, key: str, turns_done: int) -> float | None:
        """Model turns still to come, the next one included, for a trajectory of prompt
        ``key`` that has made ``turns_done`` and goes on (None: no history at all).

        The mean over the recorded lengths past ``turns_done``; 1 when none went past.
        """
        seen: Sequence[int] | None = self._turns.get(key)
        if seen:
            self.own += 1
        elif self._pooled:
            self.pooled += 1
            seen = self._pooled
        else:
            self.none += 1
            return None
        longer = [total - turns_done for total in seen if total > turns_done]
        return sum(longer) / len(longer) if longer else 1.0

    def statistics(self) -> dict[str, int]:
        """Prompts known, and where each prediction came from."""
        return {"prompts": len(self), "own": self.own, "pooled": self.pooled, "none": self.none}

    def to_dict(self) -> dict[str, list[int]]:
        """The per-prompt lengths, to carry the history to another process (JSON-friendly)."""
        return {key: list(seen) for key, seen in self._turns.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Sequence[int]], window: int = 32) -> WorkHistory:
        history = cls(window)
        for key, lengths in data.items():
            for turns in lengths:
                history.record(str(key), int(turns))
        return history

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> WorkHistory:
        """A history saved by :meth:`write` (a missing file: an empty history)."""
        where = Path(path)
        if not where.exists():
            return cls()
        try:
            data = json.loads(where.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UserError(f"{where}: not a work history ({exc})") from None
        lengths = data.get("turns") if isinstance(data, dict) else None
        if not isinstance(lengths, dict) or not all(
            isinstance(v, list) and all(isinstance(t, int) for t in v) for v in lengths.values()
        ):
            raise UserError(f"{where}: key 'turns' must map prompt keys to lists of turn counts")
        return cls.from_dict(lengths)

    def write(self, path: str | os.PathLike[str]) -> None:
        """Save the per-prompt lengths as JSON, replacing the file in one step."""
        where = Path(path)
        partial = where.with_name(where.name + ".partial")
        partial.write_text(json.dumps({"turns": self.to_dict()}), encoding="utf-8")
        os.replace(partial, where)


class PriorityPolicy:
    """Trajectory state -> SGLang priority (larger = sooner, before the server's sign)."""

    def __init__(
        self,
        config: SchedulingConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        history: WorkHistory | None = None,
    ):
        self.config = config
        self._clock = clock
        self.history = history if history is not None or not config.history else WorkHistory()
        self._started: dict[str, float] = {}
        self._group_done: dict[str, int] = defaultdict(int)
        self._members: dict[str, set[str]] = defaultdict(set)

    def urgency(
        self,
        uid: str,
        group_id: str,
        turns_done: int,
        group_size: int = 1,
        prompt_key: str | None = None,
        age_band: int | None = None,
    ) -> int:
        """How urgent the next request of a trajectory is (0 for a fresh one).

        With a history, ``prompt_key`` names the prompt whose earlier lengths predict this
        trajectory's; under ``oldest`` without one, ``age_band`` takes the place of the
        turns done.
        """
        now = self._clock()
        started = self._started.setdefault(uid, now)
        members = self._members[group_id]
        members.add(uid)
        group_size = max(group_size, len(members))
        expected = None
        if self.history is not None and prompt_key is not None:
            expected = self.history.expected_remaining(prompt_key, turns_done)
        if expected is not None:
            value = round(self.config.history_weight * expected)
        elif self.config.oldest and not self.config.history and age_band is not None:
            value = min(max(age_band, 0), self.config.oldest_levels)
        else:
            value = self.config.turn_weight * turns_done
        if self.config.wait_weight_s > 0:
            value += int((now - started) / self.config.wait_weight_s)
        if self.config.group_weight and group_size > 1:
            share = self._group_done[group_id] / group_size
            value += math.floor(self.config.group_weight * share)
        return int(value)

    def finished(
        self,
        uid: str,
        group_id: str,
        turns: int = 0,
        prompt_key: str | None = None,
        group_size: int = 1,
    ) -> bool:
        """A trajectory ended; whether that completed its group (every sample seen so far
        and at least ``group_size`` of them done)."""
        self._started.pop(uid, None)
        self._group_done[group_id] += 1
        if self.history is not None and prompt_key is not None:
            self.history.record(prompt_key, turns)
        done = self._group_done[group_id]
        return done >= max(group_size, len(self._members[group_id]))
