"""Quality bar of the shipped demo model on its python and search tasks (held-out prompts).

Sampled at temperature 1.0 with no top-k/top-p, as an RL rollout samples. Python: the
model must write the reference program for a held-out question (compared as text, so no
model-written code runs here; ``tests/cli/test_generate.py`` runs it in the real sandbox)
and, given that program's output, answer with it. Search: a full multi-turn episode with
the real BM25 index and the search tool's formatter, the model's own queries deciding what
it sees; the bar is on its first query naming the question's entity (the final answer is
measured and reported, but this tiny model rarely reads the fact out of the passages).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from toolrollout.apps.demo import DEMO_MODEL_PATH, load_demo_prompts
from toolrollout.apps.demo.code_tasks import is_heldout_code, sandbox_schema
from toolrollout.apps.demo.dialogs import FAMILIES, TRAIN_FAMILY_MIX, training_dialogs
from toolrollout.apps.demo.search_tasks import (
    is_heldout_question,
    search_schema,
    search_tasks,
    search_text,
)
from toolrollout.apps.demo.train import parse_args

pytestmark = pytest.mark.slow

# Measured on the shipped model (seeds 1234, 1, 2, 3): python call 0.47-0.50, answer
# 0.81-0.93; search first query 0.41-0.63, whole episodes about 0.03 (docs/quickstart.md).
MIN_PYTHON_CALL = 0.35
MIN_PYTHON_ANSWER = 0.70
MIN_SEARCH_FIRST_QUERY = 0.35
N_PYTHON = 32
SEED = 1234
_CALL_RE = re.compile(r"<tool_call>\n(\{.*\})\n</tool_call><\|im_end\|>", re.DOTALL)


def sample(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    conversations: list[list[dict[str, Any]]],
    tools: list[dict[str, Any]],
    max_new_tokens: int = 96,
) -> list[str]:
    """One assistant turn per conversation, pure sampling at temperature 1.0."""
    if not conversations:
        return []
    texts = [
        tokenizer.apply_chat_template(
            c, tools=list(tools), add_generation_prompt=True, tokenize=False
        )
        for c in conversations
    ]
    tokenizer.padding_side = "left"
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(
            **batch,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    completions: list[str] = []
    for row in out[:, batch["input_ids"].shape[1] :].tolist():
        if tokenizer.eos_token_id in row:
            row = row[: row.index(tokenizer.eos_token_id) + 1]
        text = tokenizer.decode(row, skip_special_tokens=False)
        assert isinstance(text, str)
        completions.append(text)
    return completions


def parse_call(completion: str, name: str) -> dict[str, Any] | None:
    """The arguments of a well-formed single call of tool ``name``, else None."""
    match = _CALL_RE.fullmatch(completion)
    if match is None:
        return None
    try:
        call = json.loads(match.group(1))
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or call.get("name") != name:
        return None
    args = call.get("arguments")
    return args if isinstance(args, dict) else None


def final_text(completion: str) -> str | None:
    """The content of a final (no tool call) turn, else None."""
    if not completion.endswith("<|im_end|>") or "<tool_call>" in completion:
        return None
    return completion.removesuffix("<|im_end|>").strip()


def _call_turn(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": name, "arguments": arguments}}],
    }


def measure_python(
    model: Any, tokenizer: PreTrainedTokenizerBase, prompts: list[dict[str, Any]], seed: int
) -> tuple[float, float, list[str]]:
    """(call rate, answer rate, failures): reference program written; its output stated."""
    torch.manual_seed(seed)
    tools = [sandbox_schema()]
    failures: list[str] = []
    first = sample(model, tokenizer, [p["messages"] for p in prompts], tools)
    followups = []
    for prompt, completion in zip(prompts, first, strict=True):
        args = parse_call(completion, "python")
        if args is None or args.get("code") != prompt["code"]:
            failures.append(f"call {prompt['messages'][-1]['content']!r} -> {completion!r}")
            continue
        messages = [
            *prompt["messages"],
            _call_turn("python", {"code": prompt["code"]}),
            {"role": "tool", "content": prompt["answer"]},
        ]
        followups.append((messages, prompt["answer"]))
    second = sample(model, tokenizer, [m for m, _ in followups], tools)
    good = 0
    for (_, answer), completion in zip(followups, second, strict=True):
        if final_text(completion) == answer:
            good += 1
        else:
            failures.append(f"answer {answer!r} -> {completion!r}")
    return len(followups) / len(prompts), good / max(1, len(followups)), failures


def measure_search(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[dict[str, Any]],
    seed: int,
    max_turns: int = 4,
) -> tuple[float, float, list[str]]:
    """(success rate, first-query rate, failures) of whole episodes with the real retriever
    and formatter; the first-query rate counts first turns that search exactly the entity
    the question names."""
    torch.manual_seed(seed)
    tools = [search_schema()]
    live = [(i, list(p["messages"])) for i, p in enumerate(prompts)]
    answers: dict[int, str | None] = {}
    transcripts: dict[int, list[str]] = {i: [] for i in range(len(prompts))}
    first_queries: dict[int, object] = {}
    for _ in range(max_turns):
        if not live:
            break
        completions = sample(model, tokenizer, [m for _, m in live], tools)
        still = []
        for (i, messages), completion in zip(live, completions, strict=True):
            transcripts[i].append(completion)
            args = parse_call(completion, "search")
            queries = args.get("query_list") if args is not None else None
            first_queries.setdefault(i, queries)
            if isinstance(queries, list) and queries and all(isinstance(q, str) for q in queries):
                results = "\n---\n".join(search_text(q) for q in queries)
                messages = [
                    *messages,
                    _call_turn("search", {"query_list": queries}),
                    {"role": "tool", "content": results},
                ]
                still.append((i, messages))
            else:
                answers[i] = final_text(completion)
        live = still
    failures = []
    good = 0
    for i, prompt in enumerate(prompts):
        if answers.get(i) == prompt["answer"]:
            good += 1
        else:
            failures.append(f"{prompt['messages'][-1]['content']!r} -> {transcripts[i]!r}")
    right_first = sum(first_queries.get(i) == p["queries"][:1] for i, p in enumerate(prompts))
    return good / len(prompts), right_first / len(prompts), failures


def load(path: Path) -> tuple[Any, PreTrainedTokenizerBase]:
    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(path)
    model.eval()  # type: ignore[no-untyped-call]
    return model, AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def model_and_tokenizer() -> tuple[Any, PreTrainedTokenizerBase]:
    return load(DEMO_MODEL_PATH)


def test_prompt_sets_are_heldout_and_disjoint_from_training() -> None:
    python_prompts = load_demo_prompts("python")
    search_prompts = load_demo_prompts("search")
    assert len(python_prompts) == 64 and len(search_prompts) >= 24
    assert all(is_heldout_code(p["code"]) for p in python_prompts)
    assert all(is_heldout_question(p["messages"][-1]["content"]) for p in search_prompts)
    # Training dialogs of the three-task recipe (the split is by hash, so a prefix of the
    # draw is as good a witness as the whole run, at a fraction of the cost).
    args = parse_args([])
    seen_code: set[str] = set()
    seen_questions: set[str] = set()
    for dialog in training_dialogs(3000, seed=args.seed, families=FAMILIES):
        for message in dialog.messages:
            if message["role"] == "user":
                seen_questions.add(message["content"])
            for call in message.get("tool_calls", []):
                seen_code.add(call["function"]["arguments"].get("code", ""))
    assert TRAIN_FAMILY_MIX["python"] > 0 and len(seen_code) > 100
    assert not seen_code & {p["code"] for p in python_prompts}
    assert not seen_questions & {p["messages"][-1]["content"] for p in python_prompts}
    # A held-out search fact is never asked in training, in any of its wordings.
    heldout = {p["messages"][-1]["content"] for p in search_prompts}
    groups = [g for g in search_tasks() if g[0].canonical in heldout]
    assert len(groups) == len(search_prompts)
    assert not seen_questions & {t.question for g in groups for t in g}


def test_python_quality_at_temperature_one(
    model_and_tokenizer: tuple[Any, PreTrainedTokenizerBase],
) -> None:
    model, tokenizer = model_and_tokenizer
    prompts = load_demo_prompts("python")[:N_PYTHON]
    call_rate, answer_rate, failures = measure_python(model, tokenizer, prompts, SEED)
    report = f"call rate {call_rate:.3f}, answer rate {answer_rate:.3f}\n" + "\n".join(failures)
    assert call_rate >= MIN_PYTHON_CALL, report
    assert answer_rate >= MIN_PYTHON_ANSWER, report


def test_search_calls_at_temperature_one(
    model_and_tokenizer: tuple[Any, PreTrainedTokenizerBase],
) -> None:
    model, tokenizer = model_and_tokenizer
    prompts = load_demo_prompts("search")
    success, first_query, failures = measure_search(model, tokenizer, prompts, SEED)
    report = f"first query {first_query:.3f}, success {success:.3f}\n" + "\n".join(failures)
    # The model searches for the entity the question names; reading the fact out of the
    # passages is beyond this 0.36M model (whole episodes succeed about 3% of the time).
    assert first_query >= MIN_SEARCH_FIRST_QUERY, report
    two_hop = [p for p in prompts if p["hops"] == 2]
    assert two_hop, "the held-out set must include two-hop questions"
