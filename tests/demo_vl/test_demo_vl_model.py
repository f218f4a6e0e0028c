"""The shipped VL demo folder: its script rebuilds it byte for byte; on text it is the text demo."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from toolrollout.demo import DEMO_MODEL_PATH
from toolrollout.demo_vl import DEMO_VL_MODEL_PATH
from toolrollout.demo_vl.build import build

SHIPPED = (
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "preprocessor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
)


@pytest.mark.slow
def test_the_build_script_reproduces_the_shipped_folder(tmp_path: Path) -> None:
    out = build(tmp_path / "vl")
    assert sorted(p.name for p in out.iterdir()) == sorted(SHIPPED)
    for name in SHIPPED:
        assert (out / name).read_bytes() == (DEMO_VL_MODEL_PATH / name).read_bytes(), name


def test_on_text_it_computes_the_text_demos_logits() -> None:
    """Qwen2-VL's 3-D RoPE with equal positions is Qwen2's 1-D RoPE: same weights, same logits."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    text = AutoModelForCausalLM.from_pretrained(str(DEMO_MODEL_PATH), dtype=torch.float32).eval()
    vl = AutoModelForImageTextToText.from_pretrained(
        str(DEMO_VL_MODEL_PATH), dtype=torch.float32
    ).eval()
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
