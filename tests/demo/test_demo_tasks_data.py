"""The demo's python and search training data is what the real tools return, its tool
lists are the shipped configs' schemas, and the shipped tokenizer is rebuilt by train.py."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from toolrollout.apps.demo import DEMO_MODEL_PATH, DEMO_PROMPT_SETS, demo_prompts_for_tools
from toolrollout.apps.demo.code_tasks import generate_code_tasks
from toolrollout.apps.demo.dialogs import FAMILIES, family_tools, training_dialogs
from toolrollout.apps.demo.search_tasks import search_tasks, search_text
from toolrollout.sandbox import SandboxTool, serve_sandbox_in_background
from toolrollout.search import SearchTool, serve_retriever_in_background
from toolrollout.tools import ToolContext, load_tool_config

CONFIGS = Path(__file__).resolve().parents[2] / "tool_configs"


@pytest.mark.parametrize(
    ("family", "config"),
    [("calculator", "calculator.yaml"), ("python", "sandbox.yaml"), ("search", "search.yaml")],
)
def test_training_tools_are_the_shipped_configs(family: str, config: str) -> None:
    tools = load_tool_config(CONFIGS / config)
    assert [t.schema() for t in tools] == family_tools(family)  # type: ignore[arg-type]
    assert demo_prompts_for_tools(t.name for t in tools) == DEMO_PROMPT_SETS[family]  # type: ignore[index]


def test_mcp_calculator_configs_get_the_calculator_prompts() -> None:
    assert demo_prompts_for_tools(["calculator"]) == DEMO_PROMPT_SETS["calculator"]
    assert demo_prompts_for_tools(["calculator", "search"]) == DEMO_PROMPT_SETS["search"]


def test_training_mixes_all_families_with_their_own_tools() -> None:
    dialogs = training_dialogs(300, seed=7, families=FAMILIES)
    assert {d.family for d in dialogs} == set(FAMILIES)
    for dialog in dialogs:
        names = {
            call["function"]["name"]
            for message in dialog.messages
            for call in message.get("tool_calls", [])
        }
        assert names == {dialog.family}


async def test_python_tool_outputs_are_the_real_sandbox_outputs() -> None:
    if shutil.which("bwrap") is None:
        if os.environ.get("CI"):
            pytest.fail("bubblewrap (bwrap) is not installed; CI must install it")
        pytest.skip("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    tasks = generate_code_tasks(24, seed=11, split="train")
    tasks += generate_code_tasks(8, seed=11, split="heldout")
    async with serve_sandbox_in_background(max_concurrency=2) as url:
        tool = SandboxTool.create(url, run_timeout=10, max_timeout=30)
        for task in tasks:
            result = await tool.call({"code": task.code}, ToolContext())
            assert result.text == task.result, task.code


async def test_search_tool_outputs_are_the_retriever_servers() -> None:
    queries = sorted({q for group in search_tasks() for q in group[0].queries})
    async with serve_retriever_in_background() as retriever:
        tool = SearchTool(retrieval_service_url=retriever.retrieve_url, topk=3)
        for query in queries:
            result = await tool.call({"query_list": [query]}, ToolContext())
            assert result.text == search_text(query), query


@pytest.mark.slow
def test_build_tokenizer_reproduces_the_shipped_tokenizer() -> None:
    """Retraining is minutes; the tokenizer step alone proves the data and its order."""
    from toolrollout.apps.demo.tokenizer import build_tokenizer
    from toolrollout.apps.demo.train import parse_args, training_texts

    args = parse_args([])
    tokenizer = build_tokenizer(training_texts(args)[: args.tokenizer_dialogs])
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        rebuilt = (Path(folder) / "tokenizer.json").read_bytes()
    assert rebuilt == (DEMO_MODEL_PATH / "tokenizer.json").read_bytes()
