"""The global batch target of ``generate --ray --target-groups`` (docs/scale-out.md).

One small Ray actor holding a :class:`BatchCoordinator` counts finished groups over all
shards; workers report to it and poll it for the stop. Plain Python: the driver wraps it
with ``ray.remote``, so it can be tested without Ray.
"""

from __future__ import annotations

from collections.abc import Iterable

from toolrollout._exceptions import UserError

__all__ = ["BatchCoordinator"]

Key = tuple[str, int]
"""(group_id, sample_index) of one sample."""


class BatchCoordinator:
    """Counts finished samples from every shard and decides the batch, first come first in.

    The same rule as a one-process batch: with ``keep_groups_whole`` a group counts once
    all ``n`` of its samples have finished (completed, truncated or failed) and the target
    is ``target_groups`` such groups; without it, the first ``target_groups * n`` finished
    samples of any groups. Reports that arrive after the target is met change nothing.
    """

    def __init__(self, target_groups: int, n: int, keep_groups_whole: bool = True) -> None:
        if target_groups < 1 or n < 1:
            raise UserError(f"need target_groups >= 1 and n >= 1, got {target_groups}, {n}")
        self._target = target_groups * n
        self._n = n
        self._whole = keep_groups_whole
        self._finished: dict[str, set[int]] = {}
        self._order: list[Key] = []
        self._batch: list[Key] = []
        self._stopped = False

    def report(self, keys: Iterable[Key]) -> bool:
        """Record finished samples; returns whether the batch target is met (stop)."""
        for group_id, sample_index in keys:
            if self._stopped:
                break
            samples = self._finished.setdefault(group_id, set())
            if sample_index in samples:
                continue  # a repeated report
            samples.add(sample_index)
            self._order.append((group_id, sample_index))
            if self._whole:
                if len(samples) == self._n:
                    self._batch.extend((group_id, s) for s in sorted(samples))
                met = len(self._batch) >= self._target
            else:
                met = len(self._order) >= self._target
                if met:
                    self._batch = self._order[: self._target]
            self._stopped = met
        return self._stopped

    def stopped(self) -> bool:
        """Whether the target is met: every worker should stop its batch."""
        return self._stopped

    def chosen(self) -> list[Key]:
        """The samples of the batch (if the target was never met: all finished so far, as
        complete groups with ``keep_groups_whole``)."""
        if not self._whole and not self._stopped:
            return list(self._order)
        return list(self._batch)
