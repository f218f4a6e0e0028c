"""Every ``[...]`` in an option's help reaches ``--help`` (rich markup reads it as a tag).

``pip install -e '.[ray]'`` once rendered as ``pip install -e '.'``: rich took ``[ray]`` for
a style and dropped it. Help strings write ``\\[`` for a literal bracket.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import typer
from typer.testing import CliRunner

from toolrollout.apps.cli import app


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    if hasattr(command, "commands"):  # a group (typer's command classes, whatever click)
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))


def test_bracketed_help_text_is_shown() -> None:
    root = typer.main.get_command(app)
    checked = 0
    for path, command in _commands(root):
        texts = [help for p in command.params if (help := getattr(p, "help", None))]
        brackets = [b.replace("\\[", "[") for t in texts for b in re.findall(r"\\?\[\w+\]", t)]
        if not brackets:
            continue
        result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "400"})
        assert result.exit_code == 0, result.output
        for bracket in brackets:
            assert bracket in result.output, f"toolrollout {' '.join(path)} --help: {bracket}"
            checked += 1
    assert checked >= 1  # generate --ray's "pip install -e '.[ray]'" at least
