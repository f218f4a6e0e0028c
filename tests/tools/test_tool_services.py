"""Tools own their services: ``Tool.services()``, ``open_tools``, and tool types by name."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import AsyncIterator, Hashable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

import toolrollout.tools._registry as registry
from toolrollout._exceptions import ConfigError, UserError
from toolrollout.tools import (
    BuildContext,
    Tool,
    ToolContext,
    ToolEntryModel,
    ToolExecutor,
    ToolResult,
    ToolService,
    calculator_tool,
    open_tools,
    register_tool_type,
    tool_types,
)
from toolrollout.tools._config import build_native_entry, tools_from_config

TOOLS_SRC = Path(__file__).resolve().parents[2] / "src" / "toolrollout" / "tools"


@dataclass(frozen=True, slots=True)
class Recorder:
    """A service that writes what happens to it into ``log``."""

    name: str
    log: list[str] = field(default_factory=list, compare=False)
    fail: bool = False

    @property
    def key(self) -> Hashable:
        return ("test", self.name)

    @asynccontextmanager
    async def open(self) -> AsyncIterator[None]:
        if self.fail:
            raise UserError(f"{self.name} cannot start")
        self.log.append(f"open {self.name}")
        try:
            yield
        finally:
            self.log.append(f"close {self.name}")


@dataclass(frozen=True, kw_only=True)
class Needs(Tool):
    """A tool that answers whether its services are open."""

    needs: tuple[Recorder, ...] = ()

    def services(self) -> Sequence[ToolService]:
        return self.needs

    async def call(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        log = self.needs[0].log
        name = self.needs[0].name
        is_open = log.count(f"open {name}") > log.count(f"close {name}")
        return ToolResult(text="open" if is_open else "closed")


def test_a_service_is_a_tool_service_and_tools_need_none_by_default() -> None:
    assert isinstance(Recorder("a"), ToolService)
    assert calculator_tool().services() == ()


async def test_open_tools_opens_each_key_once_and_closes_in_reverse() -> None:
    log: list[str] = []
    a, b = Recorder("a", log), Recorder("b", log)
    tools = [
        Needs(name="one", needs=(a,)),
        calculator_tool(),
        Needs(name="two", needs=(Recorder("a", log), b)),  # equal to `a`: shared
    ]
    async with open_tools(tools) as opened:
        assert opened == tools
        assert log == ["open a", "open b"]
        result = await ToolExecutor(opened).run_call(_request("one"), ToolContext())
        assert result.text == "open"
    assert log == ["open a", "open b", "close b", "close a"]


async def test_services_close_when_the_body_fails_or_is_cancelled() -> None:
    log: list[str] = []
    tools = [Needs(name="one", needs=(Recorder("a", log),))]
    with pytest.raises(ValueError, match="boom"):
        async with open_tools(tools):
            raise ValueError("boom")
    assert log == ["open a", "close a"]
    with anyio.move_on_after(0.01):
        async with open_tools(ToolExecutor(tools)):  # an executor works too
            await anyio.sleep_forever()
    assert log == ["open a", "close a", "open a", "close a"]


async def test_a_service_failing_to_open_closes_those_opened_before() -> None:
    log: list[str] = []
    tools = [Needs(name="one", needs=(Recorder("a", log), Recorder("b", log, fail=True)))]
    with pytest.raises(UserError, match="b cannot start"):
        async with open_tools(tools):
            pytest.fail("the body must not run")
    assert log == ["open a", "close a"]


async def test_two_different_services_under_one_key_are_an_error() -> None:
    tools = [
        Needs(name="one", needs=(Recorder("a"),)),
        Needs(name="two", needs=(Recorder("a", fail=True),)),
    ]
    with pytest.raises(UserError, match="tools 'one' and 'two' need different services"):
        async with open_tools(tools):
            pass


def _request(name: str) -> Any:
    from toolrollout.tools import ToolCallRequest

    return ToolCallRequest(name, {})


# --- tool types by name ---------------------------------------------------------------


def _mine(entry: ToolEntryModel, context: BuildContext) -> list[Tool]:
    """A builder that records its context in the tool's description."""
    extra = entry.config.model_extra or {}
    target = context.resolve(str(extra.get("file", "x.txt")))
    description = f"{context.source}|{context.index}|{target}|{context.where('config')}"
    return [Needs(name=f"mine{context.index}", description=description)]


def test_a_registered_type_builds_entries_with_an_explicit_context(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(registry, "_types", dict(registry._types))
    register_tool_type("mine", _mine)
    assert tool_types() == ("native", "mcp", "sandbox", "search", "mine")
    data = {
        "tools": [
            {"class_name": "toolrollout.tools.CalculatorTool"},
            {"class_name": "anything", "config": {"type": "mine", "file": "data/a.txt"}},
        ]
    }
    calc, mine = tools_from_config(data, source="cfg.yaml", base_dir=tmp_path)
    assert calc.name == "calculator"
    assert mine.description == (
        f"cfg.yaml|1|{tmp_path / 'data' / 'a.txt'}|cfg.yaml: tools[1].config"
    )
    with pytest.raises(UserError, match="already registered"):
        register_tool_type("mine", _mine)
    register_tool_type("mine", build_native_entry, replace=True)


def registered(name: str) -> object:
    return registry._types[name]


def test_a_type_registered_by_name_is_imported_on_first_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(registry, "_types", dict(registry._types))
    register_tool_type("lazy", f"{__name__}:_mine")
    assert registered("lazy") == f"{__name__}:_mine"
    [tool] = tools_from_config({"tools": [{"class_name": "x", "config": {"type": "lazy"}}]})
    assert tool.name == "mine0"
    assert registered("lazy") is _mine  # resolved once
    register_tool_type("broken", "no_such_module_here:build")
    with pytest.raises(ConfigError, match=r"tools\[0\].config.type: tool type 'broken': cannot"):
        tools_from_config({"tools": [{"class_name": "x", "config": {"type": "broken"}}]})
    with pytest.raises(UserError, match="module:attribute"):
        register_tool_type("bad", "no colon")


def test_an_unknown_type_names_the_registered_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_types", dict(registry._types))
    register_tool_type("mine", _mine)
    with pytest.raises(ConfigError) as info:
        tools_from_config({"tools": [{"class_name": "x", "config": {"type": "remote"}}]})
    assert str(info.value) == (
        "<tool config>: tools[0].config.type: must be one of 'native', 'mcp', 'sandbox', "
        "'search' or 'mine' (got 'remote')"
    )


def test_the_tools_package_imports_no_backend() -> None:
    """No import statement in tools/ (lazy or not) names the sandbox, search or demo apps."""
    apps = ("toolrollout.sandbox", "toolrollout.search", "toolrollout.apps.demo")
    for path in TOOLS_SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(apps), f"{path.name} imports {name}"
        assert "sys.modules" not in path.read_text(encoding="utf-8"), path.name
        assert "ContextVar" not in path.read_text(encoding="utf-8"), path.name
    code = (
        "import sys, toolrollout.tools as t\n"
        "t.load_tool_config('tool_configs/calculator.yaml')\n"
        "print(sorted(m for m in sys.modules if m.startswith(('toolrollout.sandbox', "
        "'toolrollout.search', 'toolrollout.apps.demo', 'toolrollout.tools.mcp', 'mcp'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=TOOLS_SRC.parents[2],
    )
    assert out.stdout.strip() == "[]"


# --- the shipped services -------------------------------------------------------------


def test_sandbox_tools_on_one_port_share_one_local_sandbox() -> None:
    from toolrollout.sandbox import LocalSandboxService, sandbox_tool
    from toolrollout.tools._services import services_of

    python = sandbox_tool("http://127.0.0.1:8123/run_code", local_sandbox=True)
    bash = sandbox_tool(
        "http://localhost:8123/run_code", language="bash", name="bash", local_sandbox=True
    )
    remote = sandbox_tool("http://127.0.0.1:8124/run_code")  # not asked for
    assert services_of([python, bash, remote]) == [LocalSandboxService(8123)]
    with pytest.raises(UserError, match="local_sandbox needs a local"):
        sandbox_tool("http://sandbox.example:8080/run_code", local_sandbox=True).services()


async def test_search_tools_asking_for_two_corpora_on_one_port_fail_before_anything_starts(
    tmp_path: Path,
) -> None:
    from toolrollout.search import LocalRetrieverService, SearchTool
    from toolrollout.search.demo_corpus import DEMO_CORPUS_PATH

    other = tmp_path / "corpus.jsonl"
    other.write_text('{"id": "1", "contents": "x"}\n', encoding="utf-8")
    url = "http://127.0.0.1:8125/retrieve"
    demo = SearchTool(name="a", retrieval_service_url=url, local_corpus="demo")
    assert demo.services() == (
        LocalRetrieverService("127.0.0.1", 8125, DEMO_CORPUS_PATH.resolve()),
    )
    clash = SearchTool(name="b", retrieval_service_url=url, local_corpus=str(other))
    with pytest.raises(UserError, match="tools 'a' and 'b' need different services"):
        async with open_tools([demo, clash]):
            pytest.fail("nothing may start")
