"""The scheduling policies' settings (:class:`SchedulingConfig`); see :mod:`._scheduling`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from toolrollout._exceptions import UserError

__all__ = ["SchedulingConfig"]


@dataclass(frozen=True, slots=True)
class SchedulingConfig:
    """Which client-side scheduling policies a rollout uses, and their knobs.

    Every policy is off by default: each changes what a real server does.
    """

    priority: bool = False
    """Send a per-request priority (only to servers with priority scheduling enabled)."""
    turn_weight: int = -1
    """Priority per finished model turn. -1 (default): fewer turns done, served sooner; 1,
    the reverse, made the makespan longer than first come, first served (docs/benchmarks.md)."""
    wait_weight_s: float = 0.0
    """One priority step per this many seconds since the trajectory started (0: off)."""
    group_weight: int = 0
    """Up to this much more priority as the trajectory's GRPO group nears completion."""
    admission: bool = False
    """Adapt the number of requests in flight to the servers' ``/v1/loads`` report."""
    kv_target: float = 0.90
    """Admission keeps the servers' KV usage (``token_usage``) under this share."""
    admission_min: int = 16
    """Admission never goes below this many requests in flight."""
    admission_step: int = 32
    """Additive increase per poll while there is room (decrease is multiplicative, x0.7)."""
    poll_s: float = 0.25
    """How often admission reads the load report (at most), and the window over which the
    ``lag`` policy takes the loop's median lateness."""
    lag: bool = False
    """Adapt the number of requests in flight to the client's own event-loop lag."""
    lag_target_ms: float = 25.0
    """The ``lag`` policy backs off while a 10 ms sleep wakes later than this, and grows
    back while it wakes within half of it."""
    affinity: bool = False
    """Send every sample of one prompt to the same server."""
    oldest: bool = False
    """Waiting requests of the GRPO groups that started first are served first, so that groups
    complete one after another instead of all near the end."""
    oldest_levels: int = 9
    """With ``oldest`` and ``priority``: the priority of the oldest of ``oldest_levels + 1`` age
    bands, the youngest 0 (9: within SGLang's preemption threshold of 10, so nothing is
    preempted)."""
    group_key: str | None = None
    """Row metadata key that names the GRPO group when a prompt's samples come as separate
    rows (each its own ``group_id``); None: the run's ``group_id``."""
    history: bool = False
    """With ``priority``: serve first the trajectories expected to make the most model turns
    still, as learnt from the same prompt's earlier trajectories (:class:`WorkHistory`)."""
    history_weight: int = 2
    """Priority per expected remaining model turn (2: five turns apart stay within SGLang's
    default preemption threshold of 10, so the queue is reordered and nothing preempted)."""
    history_key: str | None = None
    """Row metadata key holding an id of the prompt that is the same at every step; None:
    a hash of the prompt's messages."""

    def __post_init__(self) -> None:
        if not 0.0 < self.kv_target <= 1.0:
            raise UserError(f"kv_target must be in (0, 1], got {self.kv_target}")
        if self.admission_min < 1 or self.admission_step < 1:
            raise UserError("admission_min and admission_step must be at least 1")
        if self.poll_s <= 0 or self.wait_weight_s < 0:
            raise UserError("poll_s must be positive and wait_weight_s not negative")
        if self.history and not self.priority:
            raise UserError("history orders requests by priority: set priority=True as well")
        if self.history_weight < 1:
            raise UserError(f"history_weight must be at least 1, got {self.history_weight}")
        if not self.lag_target_ms > 0:
            raise UserError(f"lag_target_ms must be positive, got {self.lag_target_ms}")
        if self.oldest_levels < 1:
            raise UserError(f"oldest_levels must be at least 1, got {self.oldest_levels}")

    @property
    def enabled(self) -> bool:
        return self.priority or self.admission or self.affinity or self.lag or self.oldest

    POLICIES = ("admission", "affinity", "history", "lag", "oldest", "priority")
    """The policies :meth:`from_names` knows (``history`` brings ``priority`` with it)."""

    @classmethod
    def from_names(cls, names: str, **knobs: Any) -> SchedulingConfig | None:
        """The config a comma-separated list of policies asks for (None for "" or "none")."""
        chosen = {name.strip() for name in names.split(",") if name.strip()} - {"none"}
        unknown = sorted(chosen - set(cls.POLICIES))
        if unknown:
            raise UserError(
                f"unknown scheduling policy {', '.join(unknown)}: choose from "
                + ", ".join(cls.POLICIES)
            )
        if not chosen:
            return None
        return cls(
            priority="priority" in chosen or "history" in chosen,
            admission="admission" in chosen,
            affinity="affinity" in chosen,
            history="history" in chosen,
            lag="lag" in chosen,
            oldest="oldest" in chosen,
            **knobs,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
