"""Optional dependencies: the bare library stays light, a missing extra is one line naming it."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from toolrollout._extras import EXTRAS, extra_for_module, require_extra
from toolrollout.apps.cli import app
from toolrollout.exceptions import MissingExtraError, UserError

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

# The distribution that installs each module of EXTRAS.
DISTRIBUTION = {
    "pyarrow": "pyarrow",
    "transformers": "transformers",
    "PIL": "pillow",
    "mcp": "mcp",
    "httpx2": "httpx2",
    "jsonschema": "jsonschema",
    "torch": "torch",
    "safetensors": "safetensors",
    "fastapi": "fastapi",
    "uvicorn": "uvicorn",
    "bm25s": "bm25s",
    "Stemmer": "PyStemmer",
    "numpy": "numpy",
    "av": "av",
    "matplotlib": "matplotlib",
    "typer": "typer",
    "rich": "rich",
}

# Modules of the applications: a bare `pip install toolrollout` has none of them.
OPTIONAL = (*DISTRIBUTION, "tokenizers", "mlflow", "wandb", "ray", "trl", "verl", "swift")


def _project() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads(PYPROJECT.read_text())["project"]
    return project


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].lower()


def _expanded(extra: str, extras: dict[str, list[str]]) -> set[str]:
    """The distributions an extra installs, following ``toolrollout[...]`` references."""
    names: set[str] = set()
    for requirement in extras[extra]:
        if requirement.startswith("toolrollout["):
            for inner in requirement.removeprefix("toolrollout[").rstrip("]").split(","):
                names |= _expanded(inner.strip(), extras)
        else:
            names.add(_name(requirement))
    return names


def test_core_dependencies_are_the_library_only() -> None:
    core = {_name(r) for r in _project()["dependencies"]}
    heavy = {"torch", "transformers", "tokenizers", "safetensors", "fastapi", "uvicorn"}
    heavy |= {"bm25s", "pystemmer", "mcp", "httpx2", "pyarrow", "pillow", "numpy"}
    heavy |= {"typer", "rich"}  # the command line's, not the library's
    assert not core & heavy


def test_extras_table_matches_pyproject() -> None:
    extras = _project()["optional-dependencies"]
    everything = _expanded("all", extras)
    for extra, modules in EXTRAS.items():
        installed = _expanded(extra, extras)
        for module in modules:
            assert DISTRIBUTION[module].lower() in installed, (extra, module)
            assert DISTRIBUTION[module].lower() in everything, (extra, module)
    assert "toolrollout[all]" in extras["test"]  # the tests run every application


def test_require_extra_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    require_extra("serve", "toolrollout serve")  # installed here: no error
    monkeypatch.setitem(sys.modules, "torch", None)  # what `import torch` sees when absent
    with pytest.raises(MissingExtraError) as caught:
        require_extra("serve", "toolrollout serve")
    message = str(caught.value)
    assert "pip install 'toolrollout[serve]'" in message
    assert "torch is not installed" in message
    assert "\n" not in message
    assert caught.value.extra == "serve"
    assert caught.value.name == "torch"
    assert isinstance(caught.value, UserError)
    assert isinstance(caught.value, ImportError)
    require_extra("serve", "a tokenizer", "transformers")  # narrowed: torch not needed


def test_extra_for_module_is_the_smallest_provider() -> None:
    assert extra_for_module("pyarrow.parquet") == "parquet"
    assert extra_for_module("torch") == "serve"
    assert extra_for_module("fastapi") == "sandbox"
    assert extra_for_module("bm25s") == "search"
    assert extra_for_module("mcp.types") == "mcp"
    assert extra_for_module("numpy") == "search"
    assert extra_for_module("os") is None


@pytest.mark.parametrize(
    ("args", "missing", "extra"),
    [
        (["serve"], "torch", "serve"),
        (["serve"], "fastapi", "serve"),
        (["retriever", "serve"], "bm25s", "search"),
        (["sandbox", "serve"], "uvicorn", "sandbox"),
        (["generate"], "pyarrow", "cli"),
        (["generate", "--engine-url", "http://127.0.0.1:9"], "transformers", "cli"),
        (["eval"], "numpy", "eval"),
        (["bench"], "torch", "bench"),
    ],
)
def test_a_command_without_its_extra_fails_in_one_line(
    monkeypatch: pytest.MonkeyPatch, args: list[str], missing: str, extra: str
) -> None:
    monkeypatch.setitem(sys.modules, missing, None)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert f"pip install 'toolrollout[{extra}]'" in lines[0]
    assert lines[0].startswith("error: ")


def test_the_console_script_turns_a_missing_module_into_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A command that reaches an optional module past its check still ends in one line."""
    import toolrollout.apps.cli as cli

    def command() -> None:
        raise ModuleNotFoundError("No module named 'pyarrow'", name="pyarrow")

    monkeypatch.setattr(cli, "app", command)
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: pyarrow is not installed: pip install 'toolrollout[parquet]'"

    def entry_point() -> None:
        raise MissingExtraError("X needs the 'serve' extra", extra="serve", module="torch")

    monkeypatch.setattr(cli, "app", entry_point)
    with pytest.raises(SystemExit):
        cli.main()
    assert capsys.readouterr().err.strip() == "error: X needs the 'serve' extra"

    def broken() -> None:
        raise ModuleNotFoundError("No module named 'nonesuch'", name="nonesuch")

    monkeypatch.setattr(cli, "app", broken)
    with pytest.raises(ModuleNotFoundError):  # not an optional dependency: a real bug
        cli.main()


BARE = """
import sys
for name in {optional!r}:
    sys.modules[name] = None  # as in a bare `pip install toolrollout`
import toolrollout
import toolrollout.chat, toolrollout.engines, toolrollout.rewards, toolrollout.rollout
import toolrollout.tools, toolrollout.apps, toolrollout.testing
from toolrollout.exceptions import MissingExtraError
for load in (
    lambda: toolrollout.read_rows,
    lambda: __import__("toolrollout.engines.embedded"),
    lambda: __import__("toolrollout.apps.server"),
):
    try:
        load()
    except MissingExtraError as exc:
        print(exc.extra)
sys.argv = ["toolrollout", "serve"]
toolrollout.apps.main()
"""


def test_a_bare_install_imports_the_library_and_names_the_extras() -> None:
    code = BARE.format(optional=OPTIONAL)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    assert out.stdout.split() == ["parquet", "serve", "serve"]
    assert out.stderr.strip().splitlines() == [
        "error: the toolrollout command needs the 'cli' extra (typer is not installed): "
        "pip install 'toolrollout[cli]'"
    ]


def test_the_command_without_its_own_dependencies_fails_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """typer and rich are the `cli` extra's, not the library's: the bare install says so."""
    from toolrollout.apps import main

    monkeypatch.setitem(sys.modules, "typer", None)
    with pytest.raises(SystemExit) as caught:
        main()
    message = str(caught.value.code)
    assert "pip install 'toolrollout[cli]'" in message and "typer" in message
    assert "\n" not in message
