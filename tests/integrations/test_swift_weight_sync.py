"""ms-swift: the ``toolrollout_weight_sync`` callback loads each step's weights into the engine.

The callback is taken from ms-swift's own ``callbacks_map`` after its plugin loader ran the
shipped plugin file, built the way ms-swift's trainer builds callbacks
(``callbacks_map[name](args, trainer)``), and driven through the Hugging Face callback
events of two optimizer steps. The engine is the scripted test engine, which records every
``update_weights_from_disk``; the checkpoint it is handed is loaded back with transformers.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from swift.callbacks import callbacks_map
from swift.utils import import_external_file
from transformers import AutoModelForCausalLM

from toolrollout.apps.demo import DEMO_MODEL_PATH
from toolrollout.integrations import SWIFT_PLUGIN_PATH
from toolrollout.testing import ScriptedEngine


def _trainer(tmp_path: Path, demo_tokenizer: Any) -> Any:
    model = AutoModelForCausalLM.from_pretrained(str(DEMO_MODEL_PATH), dtype=torch.float32)
    model.train()  # as during training (the metric goes to the "train" buffer)
    return SimpleNamespace(
        model=model,
        args=SimpleNamespace(output_dir=str(tmp_path / "out")),
        state=SimpleNamespace(global_step=0),
        processing_class=demo_tokenizer,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )


def test_callback_syncs_at_start_and_after_every_step(tmp_path: Path, demo_tokenizer: Any) -> None:
    import_external_file(str(SWIFT_PLUGIN_PATH))
    engine = ScriptedEngine([])
    trainer = _trainer(tmp_path, demo_tokenizer)
    callback = callbacks_map["toolrollout_weight_sync"](trainer.args, trainer, engine=engine)
    state = trainer.state
    callback.on_train_begin(trainer.args, state, None)
    for step in (1, 2):
        with torch.no_grad():
            next(trainer.model.parameters()).add_(0.5)  # the optimizer step
        state.global_step = step
        callback.on_step_end(trainer.args, state, None)
        callback.on_step_end(trainer.args, state, None)  # same step again: no second sync
    callback.on_train_end(trainer.args, state, None)

    assert [u.weight_version for u in engine.weight_updates] == ["0", "1", "2"]
    assert engine.weight_version == "2" and engine.closed
    folder = Path(engine.weight_updates[-1].model_path)
    assert folder == (tmp_path / "out" / "weight-sync" / "step-2").resolve()
    assert [p.name for p in folder.parent.iterdir()] == ["step-2"]  # only the newest kept
    loaded = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    for (name, ours), theirs in zip(
        trainer.model.state_dict().items(), loaded.state_dict().values(), strict=True
    ):
        assert torch.equal(ours, theirs), name
    assert len(trainer._metrics["train"]["rollout/weight_sync/seconds"]) == 3


def test_callback_off_leaves_the_engine_alone(tmp_path: Path, demo_tokenizer: Any) -> None:
    import_external_file(str(SWIFT_PLUGIN_PATH))
    engine = ScriptedEngine([])
    trainer = _trainer(tmp_path, demo_tokenizer)
    callback = callbacks_map["toolrollout_weight_sync"](
        trainer.args, trainer, engine=engine, weight_sync="off"
    )
    callback.on_train_begin(trainer.args, trainer.state, None)
    trainer.state.global_step = 1
    callback.on_step_end(trainer.args, trainer.state, None)
    assert engine.weight_updates == [] and not (tmp_path / "out").exists()


def test_callback_without_an_engine_says_which_variable(
    tmp_path: Path, demo_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import_external_file(str(SWIFT_PLUGIN_PATH))
    monkeypatch.delenv("TOOLROLLOUT_ENGINE_URL", raising=False)
    trainer = SimpleNamespace(args=None)
    with pytest.raises(Exception, match="TOOLROLLOUT_ENGINE_URL"):
        callbacks_map["toolrollout_weight_sync"](None, trainer)
