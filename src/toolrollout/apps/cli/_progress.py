"""A live progress bar for rollouts (rich), fed one finished trajectory at a time."""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any, Self

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["RolloutProgress"]


class RolloutProgress:
    """Shows done/failed counts, tool calls and generated tokens per second."""

    def __init__(self, total: int, *, completed: int = 0) -> None:
        self._progress = Progress(
            TextColumn("[bold]rollouts"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            transient=False,
        )
        self._task = self._progress.add_task("rollouts", total=total, completed=completed, stats="")
        self._failed = 0
        self._tool_calls = 0
        self._tokens = 0
        self._started = time.perf_counter()

    def __enter__(self) -> Self:
        self._progress.start()
        return self

    def update(self, trajectory: Any) -> None:
        self._failed += int(str(trajectory.status) == "failed")
        self._tool_calls += trajectory.num_tool_calls
        self._tokens += int(trajectory.metrics.get("model_tokens", 0))
        rate = self._tokens / max(time.perf_counter() - self._started, 1e-9)
        stats = f"failed {self._failed} | tool calls {self._tool_calls} | {rate:.0f} tok/s"
        self._progress.update(self._task, advance=1, stats=stats)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()
