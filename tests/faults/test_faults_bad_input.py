"""Bad input gets a clear one-line answer, never a traceback, and never kills a run.

User mistakes (unreadable or malformed datasets and tool configs, real bad bytes on disk)
stop ``toolrollout generate`` before any work with exit code 2 and one line naming the file
and the place. Rows that only turn out bad during the run (a prompt longer than the
context, a model calling a tool that does not exist) become marked rows while the rest of
the run goes on. Malformed tool-call text is fuzzed on every parser in
tests/chat/test_chat_parsers_fuzz.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner

from toolrollout.apps.cli import app
from toolrollout.chat.parsers import tool_parser_names
from toolrollout.data import load_prompts
from toolrollout.engines import GenerateRequest
from toolrollout.rollout import RolloutConfig, RolloutRunner
from toolrollout.testing import ScriptedEngine, ScriptedOutput
from toolrollout.tools import calculator_tool

DEEP = "[" * 100_000 + "]" * 100_000


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("name", "data", "expected"),
    [
        (
            "latin1.jsonl",
            b'{"messages": [{"role": "user", "content": "caf\xe9"}]}\n',
            ":1: not UTF-8",
        ),
        ("deep.jsonl", DEEP.encode() + b"\n", ":1: JSON nested too deeply"),
        ("cut.parquet", b"PAR1\x00\x01\x02 not really parquet", "cannot read parquet"),
        ("types.jsonl", b'{"messages": {"role": "user"}}\n', "row 0: 'messages' must be"),
        (
            "role.jsonl",
            b'{"prompt": [{"content": "no role"}]}\n',
            "row 0: messages[0] needs a role",
        ),
    ],
)
def test_bad_dataset_files_are_one_line_errors(
    tmp_path: Path, name: str, data: bytes, expected: str
) -> None:
    path = write(tmp_path / name, data)
    result = CliRunner().invoke(app, ["generate", "--dataset", str(path)])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and str(path) in result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "trajectories.parquet.parts").exists()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"tools:\n  - class_name: [unclosed\n", "invalid YAML at line 3"),
        (b"\xff\xfe tools", "not UTF-8 text"),
        (
            b"tools:\n  - class_name: toolrollout.tools.calculator_tool\n"
            b"    config: {timeout: x}\n",
            "tools[0].config.timeout: must be a number",
        ),
        (b"tools:\n  - class_name: no.such.module.Tool\n", "tools[0].class_name: cannot import"),
    ],
)
def test_bad_tool_configs_name_the_file_and_key(tmp_path: Path, data: bytes, expected: str) -> None:
    path = write(tmp_path / "tools.yaml", data)
    result = CliRunner().invoke(app, ["generate", "--tool-config", str(path)])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"error: {path}") and expected in result.stderr


def test_bad_rows_found_during_the_run_are_marked_and_the_run_goes_on(
    tmp_path: Path, demo_tokenizer: Any
) -> None:
    rows = [
        {"messages": [{"role": "user", "content": "What is 2 + 2?"}], "answer": "4"},
        {"messages": [{"role": "user", "content": "long " * 600}], "answer": "0"},
        {"prompt": "Call a tool that does not exist.", "answer": "0"},
    ]
    dataset = tmp_path / "mixed.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts = load_prompts(dataset)
    encode = demo_tokenizer.encode

    def respond(request: GenerateRequest) -> ScriptedOutput:
        text = demo_tokenizer.decode(list(request.input_ids))
        turn = int((request.rid or "-t0-").rsplit("-", 2)[1][1:])
        if "does not exist" in text and turn == 0:
            reply = '<tool_call>\n{"name": "teleport", "arguments": {}}\n</tool_call><|im_end|>'
        else:
            reply = "It is 4.<|im_end|>"
        ids = encode(reply, add_special_tokens=False)
        return ScriptedOutput(ids, logprobs=[-0.1] * len(ids))

    runner = RolloutRunner(
        ScriptedEngine(respond),
        demo_tokenizer,
        [calculator_tool()],
        config=RolloutConfig(context_length=512),
    )
    first, long, unknown = anyio.run(runner.run, prompts)
    assert first.status == "completed" and not first.failed
    assert long.failed and long.finish_reason == "overlong_prompt"
    assert long.error is not None and "context is 512" in long.error
    assert unknown.status == "completed" and unknown.tool_errors == 1
    [tool_message] = [m for m in unknown.messages if m["role"] == "tool"]
    assert "teleport" in tool_message["content"]


def test_every_parser_is_fuzzed() -> None:
    """The hypothesis suite covers every parser class a ``--tool-parser`` name can pick."""
    import ast

    from toolrollout.chat.parsers import get_tool_parser

    source = Path(__file__).parents[1] / "chat" / "test_chat_parsers_fuzz.py"
    tree = ast.parse(source.read_text(encoding="utf-8"))
    [names] = [
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "PARSERS"
    ]
    fuzzed = {type(get_tool_parser(name)) for name in names}
    # Other tests register their own parsers in the shared registry: only ours count here.
    shipped = {type(get_tool_parser(name)) for name in tool_parser_names()}
    shipped = {cls for cls in shipped if cls.__module__.startswith("toolrollout.")}
    assert len(shipped) >= 5
    assert shipped <= fuzzed
