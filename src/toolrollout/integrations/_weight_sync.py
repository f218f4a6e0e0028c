"""Keeping a trainer-adapter's engine on the policy being trained.

Under TRL's ``rollout_func`` (and ms-swift's scheduler) the rollout side owns the engine, so
the trainer never updates its weights. When the trainer's step moved on, the policy goes to
the engine: in process to one with ``load_weights``, else as a checkpoint the servers load
between a pause and a continue. The served ``weight_version`` becomes ``str(step)``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from toolrollout._exceptions import EngineRequestRejected, UserError
from toolrollout.engines._base import Engine

__all__ = ["WeightSync", "WeightSyncMode", "policy_state_dict"]

WeightSyncMode = Literal["auto", "off"]
"""``auto``: the adapter loads the trainer's weights into the engine after every optimizer
step; ``off``: the user syncs another way (NCCL, a colocated engine the trainer updates)."""

SYNC_SECONDS_METRIC = "rollout/weight_sync/seconds"

_PEFT_SKIP = ("lora_", "original_module")


def _unwrap(trainer: Any) -> Any:
    model = getattr(trainer, "model", None)
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is not None and model is not None:
        return accelerator.unwrap_model(model)
    return model


def _is_peft(model: Any) -> bool:
    return callable(getattr(model, "merge_adapter", None)) and callable(
        getattr(model, "unmerge_adapter", None)
    )


@contextlib.contextmanager
def policy_state_dict(trainer: Any) -> Iterator[dict[str, Any]]:
    """The trainer's current policy as a plain Hugging Face state dict, while it is valid.

    Gathers ZeRO-3 and FSDP shards (a collective call: every process must enter) and merges
    a PEFT adapter for the duration of the ``with`` block.
    """
    model = _unwrap(trainer)
    if model is None:
        raise UserError("weight sync needs trainer.model; pass weight_sync='off' to skip it")
    accelerator = getattr(trainer, "accelerator", None)
    peft = _is_peft(model)
    if peft:
        model.merge_adapter()
    try:
        kind = str(getattr(accelerator, "distributed_type", ""))
        if accelerator is not None and kind.endswith(("DEEPSPEED", "FSDP")):
            # The engine-wrapped model (DeepSpeed's engine, FSDP's module) gathers shards.
            wrapped = getattr(trainer, "model_wrapped", None) or getattr(trainer, "model", model)
            raw = accelerator.get_state_dict(wrapped)
        else:
            raw = model.state_dict()
        yield _base_names(raw) if peft else dict(raw)
    finally:
        if peft:
            model.unmerge_adapter()


def _base_names(state: Mapping[str, Any]) -> dict[str, Any]:
    """PEFT's parameter names mapped back to the base model's (what TRL's vLLM sync does)."""
    out: dict[str, Any] = {}
    for name, tensor in state.items():
        if any(part in name for part in _PEFT_SKIP):
            continue
        name = name.removeprefix("base_model.model.").replace(".base_layer", "")
        out[name.replace("modules_to_save.default.", "")] = tensor
    return out


@dataclass(frozen=True, slots=True)
class SyncResult:
    """One weight sync: the version now served and the seconds it took."""

    weight_version: str
    seconds: float
    path: str | None
    """The checkpoint folder the servers loaded (None for an in-process load)."""


class WeightSync:
    """Loads the trainer's weights into an adapter's engine once per optimizer step.

    ``call(fn)`` runs a coroutine function on the adapter's event loop. ``weights_dir`` (a
    folder every server can read; default ``<output_dir>/weight-sync``) keeps the newest
    checkpoint only.
    """

    def __init__(
        self,
        engine: Engine,
        call: Callable[[Callable[[], Any]], Any],
        *,
        mode: WeightSyncMode = "auto",
        weights_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if mode not in ("auto", "off"):
            raise UserError(f"weight_sync must be 'auto' or 'off', got {mode!r}")
        self.engine = engine
        self.mode: WeightSyncMode = mode
        self._call = call
        self._weights_dir = Path(weights_dir) if weights_dir is not None else None
        self.served_step: int | None = None
        """The trainer step whose weights the engine serves (None: not synced yet)."""
        self._previous: Path | None = None

    @property
    def in_process(self) -> bool:
        return callable(getattr(self.engine, "load_weights", None))

    def maybe_sync(self, trainer: Any, step: int | None) -> SyncResult | None:
        """Sync when ``step`` differs from the step served; None when nothing was done."""
        if self.mode == "off" or trainer is None or step is None or step == self.served_step:
            return None
        started = time.perf_counter()
        version = str(step)
        if self.in_process:
            path = None
            self._load_in_process(trainer, version)
        else:
            path = self._load_from_disk(trainer, step, version)
        self.served_step = step
        return SyncResult(version, time.perf_counter() - started, path)

    def _load_in_process(self, trainer: Any, version: str) -> None:
        load = self.engine.load_weights  # type: ignore[attr-defined]
        with policy_state_dict(trainer) as state:

            async def run() -> None:
                await load(state, weight_version=version)

            self._call(run)

    def _folder(self, trainer: Any) -> Path:
        if self._weights_dir is not None:
            return self._weights_dir.resolve()
        output_dir = getattr(getattr(trainer, "args", None), "output_dir", None)
        if not output_dir:
            raise UserError(
                "weight sync to a server needs weights_dir= (a folder the servers can read) "
                "or trainer.args.output_dir"
            )
        return (Path(output_dir) / "weight-sync").resolve()

    def _load_from_disk(self, trainer: Any, step: int, version: str) -> str:
        accelerator = getattr(trainer, "accelerator", None)
        main = accelerator is None or bool(getattr(accelerator, "is_main_process", True))
        path = self._folder(trainer) / f"step-{step}"
        with policy_state_dict(trainer) as state:  # collective under ZeRO-3 / FSDP
            if main:
                _save_checkpoint(trainer, state, path)
        _barrier(accelerator)
        try:
            if main:
                self._call(lambda: self._reload(str(path), version))
        finally:
            _barrier(accelerator)  # no process generates before the servers are updated
        if main and self._previous is not None and self._previous != path:
            shutil.rmtree(self._previous, ignore_errors=True)
        self._previous = path
        return str(path)

    async def _reload(self, path: str, version: str) -> None:
        engine = self.engine
        await engine.pause_generation("abort")
        try:
            await engine.update_weights_from_disk(path, weight_version=version)
        except EngineRequestRejected as exc:
            raise EngineRequestRejected(
                f"{exc} (the servers must read {path}: start `toolrollout serve` with "
                f"--weights-dir {Path(path).parent}, and on several nodes put it on a "
                "shared file system)",
                status_code=exc.status_code,
            ) from exc
        finally:
            await engine.continue_generation()


def _save_checkpoint(trainer: Any, state: Mapping[str, Any], path: Path) -> None:
    """A loadable model folder: config, weights (safetensors) and the tokenizer."""
    model = _unwrap(trainer)
    base = model.get_base_model() if _is_peft(model) else model
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    base.save_pretrained(tmp, state_dict=dict(state), safe_serialization=True)
    processing = getattr(trainer, "processing_class", None)
    if processing is not None and callable(getattr(processing, "save_pretrained", None)):
        processing.save_pretrained(tmp)
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)  # a server never sees a half-written folder


def _barrier(accelerator: Any) -> None:
    wait = getattr(accelerator, "wait_for_everyone", None)
    if callable(wait):
        wait()
