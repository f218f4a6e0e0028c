"""Build the tiny vision-language demo's starting point from the text demo, deterministically.

Run ``python -m toolrollout.apps.demo_vl.build --out DIR [--text-base PATH]`` (seconds). The
shipped folder is this folder with weights fine-tuned by :mod:`toolrollout.apps.demo_vl.train`,
which calls :func:`build` first; every other file is written here.

The result is a standard Hugging Face ``Qwen2VLForConditionalGeneration`` folder with a
tokenizer and a Pillow-only image processor (``Qwen2VLImageProcessorPil``: torchvision is
not needed). Its language model is the calculator-only text demo (``--text-base``, weights
copied); the three Qwen2-VL vision tokens are appended to its vocabulary; the vision tower
is a one-block ViT with seeded random weights. With identical temporal/height/width
positions, Qwen2-VL's multimodal RoPE is exactly Qwen2's 1-D RoPE, so the copied weights
compute the same logits on text (checked by ``tests/demo_vl``).

The text base is ``src/toolrollout/apps/demo_vl/text_base/`` in a source checkout, not in the
wheel: ``src/toolrollout/apps/demo/model/`` as of commit ``9ceb368`` (docs/multimodal.md,
"Retraining the VL demo", shows how git recreates it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any, Final, cast

import torch

from toolrollout._exceptions import UserError
from toolrollout.apps.demo_vl import DEMO_VL_TEXT_BASE_PATH as TEXT_BASE

__all__ = ["IMAGE_PAD", "VISION_END", "VISION_START", "build"]

VISION_START: Final = "<|vision_start|>"
VISION_END: Final = "<|vision_end|>"
IMAGE_PAD: Final = "<|image_pad|>"
_TEMPLATE: Final = Path(__file__).resolve().parent / "chat_template.jinja"
_SEED: Final = 1234
MIN_PIXELS: Final = 56 * 56
"""Smallest image area the processor keeps (one 2x2 merge of 14-pixel patches... x4)."""
MAX_PIXELS: Final = 112 * 112
"""Largest image area: at most (112/28)^2 = 16 placeholder tokens per image."""


def _tokenizer_files(out: Path, text_base: Path) -> dict[str, int]:
    """Write tokenizer.json/tokenizer_config.json with the vision tokens; return their ids."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(text_base))
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [VISION_START, VISION_END, IMAGE_PAD]},
        replace_extra_special_tokens=False,
    )
    tokenizer.chat_template = _TEMPLATE.read_text(encoding="utf-8")
    tokenizer.save_pretrained(str(out))
    return {
        name: int(cast(int, tokenizer.convert_tokens_to_ids(name)))
        for name in (VISION_START, VISION_END, IMAGE_PAD)
    }


def _config(text: dict[str, Any], vocab: int, ids: dict[str, int]) -> Any:
    from transformers import Qwen2VLConfig

    head_dim = text["hidden_size"] // text["num_attention_heads"]
    half = head_dim // 2
    section = [half - 2 * (half // 3), half // 3, half // 3]  # t, h, w: sums to head_dim/2
    text_config = {
        key: text[key]
        for key in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
            "rms_norm_eps",
            "hidden_act",
        )
    }
    text_config.update(
        vocab_size=vocab,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section},
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=text["eos_token_id"],
        pad_token_id=text["pad_token_id"],
    )
    extra: dict[str, Any] = {"eos_token_id": text["eos_token_id"]}
    extra["pad_token_id"] = text["pad_token_id"]
    return Qwen2VLConfig(
        text_config=text_config,
        vision_config={
            "depth": 1,
            "embed_dim": 32,
            "num_heads": 2,
            "mlp_ratio": 2,
            "hidden_size": text["hidden_size"],
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "in_channels": 3,
        },
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[IMAGE_PAD],  # no video token: videos reach the model as frames
        tie_word_embeddings=True,
        architectures=["Qwen2VLForConditionalGeneration"],
        **extra,
    )


def build(out: Path, text_base: Path = TEXT_BASE) -> Path:
    """Write the VL demo folder to ``out`` from the text model in ``text_base``; return it."""
    from safetensors.torch import load_file
    from transformers import Qwen2VLForConditionalGeneration, Qwen2VLImageProcessorPil

    if not (text_base / "model.safetensors").is_file():
        raise UserError(
            f"text base not found: {text_base} (not in the wheel; recreate it with "
            "`git show 9ceb368:src/toolrollout/apps/demo/model/<file>`, see "
            "toolrollout.apps.demo_vl.build) and pass --text-base PATH"
        )
    torch.manual_seed(_SEED)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    ids = _tokenizer_files(out, text_base)
    text = json.loads((text_base / "config.json").read_text(encoding="utf-8"))
    vocab = max(ids.values()) + 1
    model: Any = Qwen2VLForConditionalGeneration(_config(text, vocab, ids))
    model.eval()
    weights = load_file(str(text_base / "model.safetensors"))
    language = model.model.language_model
    with torch.no_grad():
        for name, tensor in weights.items():
            if name == "lm_head.weight":
                continue
            target = language.get_parameter(name.removeprefix("model."))
            if name.endswith("embed_tokens.weight"):
                target[: tensor.shape[0]].copy_(tensor)
                target[tensor.shape[0] :].normal_(0.0, 0.02)
            else:
                target.copy_(tensor)
    model.save_pretrained(str(out))
    processor = Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    processor.save_pretrained(str(out))
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": text["eos_token_id"], "pad_token_id": text["pad_token_id"]})
        + "\n",
        encoding="utf-8",
    )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--text-base",
        type=Path,
        default=TEXT_BASE,
        help="the calculator-only text demo (default: demo_vl/text_base/ of a source checkout)",
    )
    args = parser.parse_args(argv)
    try:
        out = build(args.out, args.text_base)
    except UserError as exc:
        parser.exit(2, f"error: {exc}\n")
    sys.stdout.write(f"{out}\n")


if __name__ == "__main__":
    main()
