"""ms-swift: a trainer callback that keeps the toolrollout engine on the trained policy.

ms-swift's own syncs reach only its vLLM engine, never the ``toolrollout`` scheduler's. This
callback (``--callbacks toolrollout_weight_sync``) saves the policy at the start of training
and after every optimizer step and has the engine load it (:class:`~._weight_sync.WeightSync`,
as in the TRL adapter), with ``weight_version = str(global_step)``.
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback

from toolrollout._exceptions import UserError
from toolrollout.engines._base import Engine

from ._portal import EnginePortal
from ._weight_sync import SYNC_SECONDS_METRIC, SyncResult, WeightSync, WeightSyncMode

__all__ = ["CALLBACK_NAME", "ToolRolloutWeightSync"]

CALLBACK_NAME = "toolrollout_weight_sync"
ENGINE_URL_ENV = "TOOLROLLOUT_ENGINE_URL"
WEIGHTS_DIR_ENV = "TOOLROLLOUT_WEIGHTS_DIR"


class ToolRolloutWeightSync(TrainerCallback):
    """Load the trainer's weights into the toolrollout engine after every optimizer step.

    ``engine`` defaults to ``TOOLROLLOUT_ENGINE_URL``, ``weights_dir`` (a folder the servers
    can read) to ``TOOLROLLOUT_WEIGHTS_DIR``, else ``<output_dir>/weight-sync``.
    """

    def __init__(
        self,
        args: Any,
        trainer: Any,
        *,
        engine: Engine | str | None = None,
        weights_dir: str | os.PathLike[str] | None = None,
        weight_sync: WeightSyncMode = "auto",
    ) -> None:
        del args  # the trainer's own, read from the trainer when needed
        target = engine if engine is not None else os.environ.get(ENGINE_URL_ENV)
        if target is None:
            raise UserError(
                f"{CALLBACK_NAME} needs the engine: set {ENGINE_URL_ENV} (the scheduler's "
                "toolrollout serve, SGLang or vLLM URL)"
            )
        if isinstance(target, str):
            from ._portal import engine_at

            target = engine_at(target)
        self.trainer = trainer
        self.engine = target
        self._portal = EnginePortal(target)
        self.sync = WeightSync(
            target,
            self._portal.call,
            mode=weight_sync,
            weights_dir=weights_dir or os.environ.get(WEIGHTS_DIR_ENV) or None,
        )
        self.last_sync: SyncResult | None = None

    def _sync(self, state: Any) -> None:
        step = getattr(state, "global_step", None)
        synced = self.sync.maybe_sync(self.trainer, step if isinstance(step, int) else None)
        if synced is None:
            return
        self.last_sync = synced
        from ._trl import _log_to_trainer

        _log_to_trainer(self.trainer, {SYNC_SECONDS_METRIC: synced.seconds})

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._sync(state)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._sync(state)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the engine client and the event-loop thread."""
        self._portal.close()


def register() -> None:
    """Put the callback in ms-swift's ``callbacks_map`` (the plugin file calls this)."""
    from swift.callbacks import callbacks_map

    callbacks_map[CALLBACK_NAME] = ToolRolloutWeightSync
