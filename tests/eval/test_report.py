"""The report: real PNG figures from matplotlib and a Markdown page that embeds them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image
from tests._trajectories import make

from toolrollout.apps.eval import compare, summarize
from toolrollout.apps.eval._report import FIGURES, write_report
from toolrollout.rollout import TrajectoryStatus


def test_report_embeds_every_figure_and_repeats_the_numbers(tmp_path: Path) -> None:
    tools = summarize(
        [
            make(0, tool_stats={"calculator": (1, 0, 0.1)}, source="a"),
            make(1, tool_stats={"calculator": (2, 1, 0.1)}, reward=0.0, source="b"),
            make(2, tool_stats={"search": (1, 0, 0.3)}, turns=3, source="b"),
        ],
        label="tools",
    )
    single = summarize(
        [
            make(0, reward=0.0, turns=1, source="a"),
            make(1, reward=0.0, turns=1, source="b"),
            make(2, turns=1, status=TrajectoryStatus.TRUNCATED, source="b"),
        ],
        label="single-turn",
    )
    comparison = compare(single, tools)
    report = write_report(tmp_path / "out", [single, tools], comparison=comparison)
    text = report.read_text()
    for name in FIGURES:
        assert f"]({name})" in text
        with Image.open(report.parent / name) as image:
            assert image.format == "PNG"
            assert image.size[0] >= 400 and image.size[1] >= 200
            assert len(image.convert("RGB").getcolors(maxcolors=1 << 16) or ()) > 10
    assert "| accuracy (`eval/accuracy`) | 0.333 | 0.667 |" in text
    assert "**+0.333**" in text
    assert "## tools: by data source" in text

    payload = json.loads((report.parent / "metrics.json").read_text())
    assert payload["runs"]["tools"]["metrics"] == pytest.approx(tools.flat_metrics(), nan_ok=True)
    assert payload["runs"]["tools"]["turns_histogram"] == {"2": 2, "3": 1}
    assert payload["runs"]["tools"]["tool_calls"] == pytest.approx(
        {"calculator": 1.0, "search": 1 / 3}
    )
    assert payload["compare"]["compare/accuracy/diff"] == pytest.approx(1 / 3)
    assert payload["compare"]["after"] == "tools"


def test_a_run_without_tool_calls_still_draws_every_figure(tmp_path: Path) -> None:
    report = write_report(tmp_path, [summarize([make(0)], label="only")])
    assert all((tmp_path / name).stat().st_size > 1000 for name in FIGURES)
    assert "only" in report.read_text()
