"""The shipped demo model folder: small, standard, and loadable with plain transformers."""

from __future__ import annotations

import json

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    BatchEncoding,
    GenerationConfig,
)

from toolrollout.apps.demo import DEMO_MODEL_PATH, DEMO_PROMPTS_PATH, load_demo_prompts
from toolrollout.tools.calculator import CALCULATOR_TOOL, calculator

MAX_BYTES = 20 * 1024 * 1024


def test_folder_files_and_size() -> None:
    names = {p.name for p in DEMO_MODEL_PATH.iterdir()}
    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    } <= names
    total = sum(p.stat().st_size for p in DEMO_MODEL_PATH.rglob("*") if p.is_file())
    assert total <= MAX_BYTES, f"demo model folder is {total} bytes"


def test_config_is_qwen2() -> None:
    config = AutoConfig.from_pretrained(DEMO_MODEL_PATH)
    assert config.model_type == "qwen2"
    assert config.architectures == ["Qwen2ForCausalLM"]
    assert config.tie_word_embeddings is True
    assert config.vocab_size == 512
    # head_dim 64 keeps every fused attention kernel usable.
    assert config.hidden_size // config.num_attention_heads in (32, 64)
    raw = json.loads((DEMO_MODEL_PATH / "config.json").read_text(encoding="utf-8"))
    assert raw["rope_theta"] == raw["rope_parameters"]["rope_theta"]


def test_generation_config_stops_at_im_end() -> None:
    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL_PATH)
    generation = GenerationConfig.from_pretrained(DEMO_MODEL_PATH)
    assert generation.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert generation.pad_token_id == tokenizer.pad_token_id


def test_loads_and_runs_on_cpu() -> None:
    model = AutoModelForCausalLM.from_pretrained(DEMO_MODEL_PATH)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert next(model.parameters()).dtype == torch.float32
    tokenizer = AutoTokenizer.from_pretrained(DEMO_MODEL_PATH)
    encoded = tokenizer.apply_chat_template(
        load_demo_prompts()[0]["messages"],
        tools=[CALCULATOR_TOOL],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    assert isinstance(encoded, BatchEncoding)
    ids = encoded["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=40, do_sample=False)
    text = tokenizer.decode(out[0, ids.shape[1] :])
    assert isinstance(text, str)
    assert text.startswith("<tool_call>\n{")


def test_prompt_rows() -> None:
    rows = load_demo_prompts()
    assert DEMO_PROMPTS_PATH.is_file()
    assert len(rows) == 64
    assert len({r["id"] for r in rows}) == len(rows)
    for row in rows:
        assert set(row) == {"id", "messages", "answer", "expression"}
        assert [m["role"] for m in row["messages"]] == ["system", "user"]
        assert row["answer"] == calculator(row["expression"])
