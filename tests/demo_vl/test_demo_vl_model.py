"""The shipped VL demo folder: the build script makes its starting point, which on text is the
text demo; the training script (tests/demo_vl/test_demo_vl_train.py) makes its weights."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from toolrollout.apps.demo_vl import DEMO_VL_MODEL_PATH, DEMO_VL_TEXT_BASE_PATH

SHIPPED = (
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "preprocessor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
)


def build_in_child(*args: str) -> None:
    """Run the build script in a child without the suite's HF_HUB_OFFLINE: offline mode is
    recorded in tokenizer_config.json (local_files_only: true), and the bytes would differ
    from the shipped folder's for a reason that has nothing to do with the build."""
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    code = "import sys; from toolrollout.apps.demo_vl.build import main; main(sys.argv[1:])"
    subprocess.run([sys.executable, "-c", code, *args], check=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def start(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("vl") / "start"
    build_in_child("--out", str(out))
    return out


def test_the_build_script_makes_every_shipped_file_but_the_weights(start: Path) -> None:
    from safetensors import safe_open

    assert sorted(p.name for p in start.iterdir()) == sorted(SHIPPED)
    for name in SHIPPED:
        if name != "model.safetensors":
            assert (start / name).read_bytes() == (DEMO_VL_MODEL_PATH / name).read_bytes(), name
    with (
        safe_open(str(start / "model.safetensors"), "pt") as built,
        safe_open(str(DEMO_VL_MODEL_PATH / "model.safetensors"), "pt") as shipped,
    ):
        assert sorted(built.keys()) == sorted(shipped.keys())
        for key in built.keys():
            assert built.get_slice(key).get_shape() == shipped.get_slice(key).get_shape(), key


def test_on_text_the_starting_point_computes_the_text_demos_logits(start: Path) -> None:
    """Qwen2-VL's 3-D RoPE with equal positions is Qwen2's 1-D RoPE: same weights, same logits."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    text = AutoModelForCausalLM.from_pretrained(str(DEMO_VL_TEXT_BASE_PATH), dtype=torch.float32)
    vl: Any = AutoModelForImageTextToText.from_pretrained(str(start), dtype=torch.float32)
    text.eval()  # type: ignore[no-untyped-call]
    vl.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(DEMO_VL_MODEL_PATH))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 12 * 7?"}], add_generation_prompt=True, tokenize=False
    )
    ids = torch.tensor([tokenizer.encode(prompt)])
    assert int(ids.max()) < text.config.vocab_size  # no vision tokens in a text prompt
    with torch.no_grad():
        expected = text(input_ids=ids).logits
        got = vl(input_ids=ids).logits[..., : expected.shape[-1]]
    assert torch.equal(got, expected) or float((got - expected).abs().max()) < 1e-5
    assert vl.config.image_token_id == tokenizer.convert_tokens_to_ids("<|image_pad|>")


def test_the_build_takes_its_text_base_from_a_path(tmp_path: Path, start: Path) -> None:
    """The text base is not in the wheel: any copy of it builds the same folder."""
    import shutil

    copy = shutil.copytree(DEMO_VL_TEXT_BASE_PATH, tmp_path / "elsewhere")
    build_in_child("--out", str(tmp_path / "out"), "--text-base", str(copy))
    for name in SHIPPED:
        assert (tmp_path / "out" / name).read_bytes() == (start / name).read_bytes(), name


def test_a_missing_text_base_says_how_to_recreate_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from toolrollout.apps.demo_vl.build import main

    with pytest.raises(SystemExit) as exited:
        main(["--out", str(tmp_path / "out"), "--text-base", str(tmp_path / "missing")])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "git show 9ceb368:src/toolrollout/apps/demo/model/" in err
    assert "--text-base" in err
    assert not (tmp_path / "out").exists()
