"""The embedded engine's weight sync, as SGLang's: pause, continue, and new weights swapped in
between two steps, from a model folder or copied in place from a trainer's state dict.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import os
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from typing import Any

import anyio
import torch

from toolrollout._exceptions import EngineUnavailable, ToolRolloutError, UserError
from toolrollout.engines._base import Engine
from toolrollout.engines._control import PauseMode, ServerWeightUpdate, WeightUpdate
from toolrollout.engines.embedded._model import LoadedModel, ModelMeta, load_meta, load_model
from toolrollout.engines.embedded._scheduler import Scheduler

__all__ = ["EMBEDDED_URL", "WeightSyncEngine"]

EMBEDDED_URL = "embedded://"
"""The ``url`` of the embedded engine's one :class:`ServerInfo`."""


class WeightSyncEngine(Engine):
    """The weight-sync half of :class:`~toolrollout.engines.EmbeddedEngine` (which sets
    these attributes and serves the requests)."""

    weight_version: str
    _meta: ModelMeta
    _model: LoadedModel | None
    _scheduler: Scheduler | None
    _trust_remote_code: bool
    _context_length_arg: int | None
    _active: set[str]
    _active_lock: threading.Condition
    _paused: bool
    _gate: asyncio.Event | None
    _update_lock: anyio.Lock

    def _count_active(self) -> int:
        with self._active_lock:
            return len(self._active)

    @property
    def paused(self) -> bool:
        """Whether :meth:`pause_generation` is in effect."""
        return self._paused

    async def wait_unpaused(self) -> None:
        """Return once new requests may start (not paused, no weight update running)."""
        while (gate := self._gate) is not None:
            await gate.wait()

    def _close_gate(self) -> None:
        if self._gate is None:
            self._gate = asyncio.Event()

    def _open_gate(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.set()

    async def pause_generation(self, mode: PauseMode = "abort") -> None:
        """Stop generating until :meth:`continue_generation` (``retract`` and ``in_place``
        behave the same here: there is no paged KV pool)."""
        self._check_pause_mode(mode)
        scheduler = self._require_scheduler()
        self._paused = True
        self._close_gate()
        if mode == "abort":
            scheduler.abort("", abort_all=True)
        scheduler.hold(True)

    async def continue_generation(self) -> None:
        """Undo :meth:`pause_generation`: frozen requests resume, waiting callers start."""
        scheduler = self._require_scheduler()
        self._paused = False
        scheduler.hold(False)
        if not self._update_lock.locked():
            self._open_gate()

    async def update_weights_from_disk(
        self,
        model_path: str | os.PathLike[str],
        *,
        weight_version: str | None = None,
        abort_all_requests: bool = False,
    ) -> WeightUpdate:
        """Load new weights from a model folder and swap them in between two steps.

        The folder must hold the same architecture and vocabulary (the tokenizer stays);
        else :class:`UserError`, and the old weights stay.
        """
        scheduler = self._require_scheduler()
        path = os.fspath(model_path)
        async with self._update_lock:
            meta = await anyio.to_thread.run_sync(self._load_meta_checked, path)
            async with self._swap_window(scheduler, abort_all_requests) as paused_requests:
                current = self._model
                assert current is not None
                try:
                    model = await anyio.to_thread.run_sync(
                        functools.partial(
                            load_model,
                            meta,
                            device=str(current.device),
                            dtype=current.dtype,
                            trust_remote_code=self._trust_remote_code,
                        )
                    )
                except Exception as exc:  # any loader failure leaves the old weights
                    raise UserError(f"cannot load the weights in {path}: {exc}") from exc
                done = scheduler.swap_model(model)
                await _until(done.is_set, scheduler, "weight update", 0.005)
                self._model = model
                self._meta = replace(self._meta, model_path=meta.model_path, config=meta.config)
                if weight_version is not None:
                    self.weight_version = weight_version
        del current
        gc.collect()
        answer = ServerWeightUpdate(
            url=EMBEDDED_URL,
            message="Succeeded to update model weights.",
            num_paused_requests=paused_requests,
        )
        return WeightUpdate(model_path=path, weight_version=weight_version, servers=(answer,))

    async def load_weights(
        self,
        state_dict: Mapping[str, torch.Tensor],
        *,
        weight_version: str,
        abort_all_requests: bool = False,
    ) -> None:
        """Copy a trainer's weights into the served model in place, between two steps.

        No checkpoint is written and no second copy of the weights is kept. ``state_dict``
        uses the served model's parameter names (unwrap DDP / accelerate first); every name
        and shape is checked before anything is copied, so a refused call leaves the old
        weights. Waits like :meth:`update_weights_from_disk`.
        """
        scheduler = self._require_scheduler()
        async with self._update_lock:
            current = self._model
            assert current is not None
            plan = copy_plan(current.model, state_dict)  # refuses before anything waits
            async with self._swap_window(scheduler, abort_all_requests):
                future = scheduler.run_between_steps(functools.partial(copy_weights, plan))
                await _until(future.done, scheduler, "weight load", 0.002)
                future.result()
                self.weight_version = weight_version

    @contextlib.asynccontextmanager
    async def _swap_window(self, scheduler: Scheduler, abort_all: bool) -> AsyncIterator[int]:
        """New requests wait while running ones end (or are aborted); yields the number of
        paused requests that wait across the swap."""
        self._close_gate()
        try:
            if abort_all:
                scheduler.abort("", abort_all=True)
            paused_requests = self._count_active() if self._paused else 0
            await anyio.to_thread.run_sync(self._wait_idle, scheduler, abandon_on_cancel=True)
            yield paused_requests
        finally:
            if not self._paused:
                self._open_gate()

    def _wait_idle(self, scheduler: Scheduler) -> None:
        """Block until no request is in flight (a pause ends the wait: they are frozen)."""
        with self._active_lock:
            while self._active and not self._paused and scheduler.alive:
                self._active_lock.wait(0.1)

    def _load_meta_checked(self, path: str) -> ModelMeta:
        try:
            meta = load_meta(
                path,
                context_length=self._context_length_arg,
                trust_remote_code=self._trust_remote_code,
            )
        except (OSError, ValueError, ToolRolloutError) as exc:
            raise UserError(f"cannot load the model folder {path!r}: {exc}") from exc
        old = self._meta
        if (meta.model_type, meta.vocab_size, meta.has_vision) != (
            old.model_type,
            old.vocab_size,
            old.has_vision,
        ):
            raise UserError(
                f"{path!r} holds a {meta.model_type} model with vocab {meta.vocab_size}; "
                f"the engine serves {old.model_type} with vocab {old.vocab_size}: "
                "weight updates must keep the architecture and vocabulary"
            )
        return meta

    def _require_scheduler(self) -> Scheduler:
        if self._scheduler is None:
            raise UserError("EmbeddedEngine is not started")
        return self._scheduler


async def _until(done: Callable[[], bool], scheduler: Scheduler, what: str, poll: float) -> None:
    while not done():
        if not scheduler.alive:
            raise EngineUnavailable(f"the scheduler stopped during a {what}")
        await anyio.sleep(poll)


CopyPlan = list[tuple[torch.Tensor, torch.Tensor]]
"""(served tensor, new value) pairs of an in-place weight load."""


def copy_plan(model: Any, state_dict: Mapping[str, torch.Tensor]) -> CopyPlan:
    """Pair every served tensor with its new value; refuse unknown, missing or misshapen ones.

    Tied weights (one storage under several names, e.g. ``lm_head.weight`` and the
    embeddings) need only one of their names.
    """
    served: dict[str, torch.Tensor] = model.state_dict()
    unknown = sorted(set(state_dict) - set(served))
    by_storage: dict[int, list[str]] = {}
    for name, tensor in served.items():
        by_storage.setdefault(tensor.data_ptr(), []).append(name)
    missing: list[str] = []
    plan: CopyPlan = []
    for names in by_storage.values():
        given = [n for n in names if n in state_dict]
        if not given:
            missing.extend(names)
            continue
        target, value = served[names[0]], state_dict[given[0]]
        if tuple(value.shape) != tuple(target.shape):
            raise UserError(
                f"load_weights: {given[0]} has shape {tuple(value.shape)}, the served model's "
                f"is {tuple(target.shape)}"
            )
        plan.append((target, value))
    if unknown or missing:
        parts = []
        if unknown:
            parts.append(f"unknown names {_few(unknown)}")
        if missing:
            parts.append(f"missing names {_few(missing)}")
        raise UserError(
            "load_weights: the state dict does not match the served model: "
            + "; ".join(parts)
            + " (pass the unwrapped model's state_dict(), without DDP/PEFT prefixes)"
        )
    return plan


def _few(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def copy_weights(plan: CopyPlan, model: LoadedModel) -> None:
    """Runs on the scheduler thread between steps."""
    del model  # the plan already holds the served tensors
    with torch.no_grad():
        for target, value in plan:
            target.copy_(value.detach())
