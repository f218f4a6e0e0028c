"""Presenting a :class:`BenchReport`: a rich table, and a matplotlib figure for docs/."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._harness import BenchReport
from ._metrics import ModeResult

__all__ = ["plot_report", "render_table"]


_COLUMNS: list[tuple[str, Callable[[ModeResult], str]]] = [
    ("mode", lambda r: r.mode),
    ("traj", lambda r: str(r.trajectories)),
    ("done", lambda r: str(r.completed)),
    ("turns", lambda r: str(r.turns)),
    ("tool calls", lambda r: str(r.tool_calls)),
    (
        "makespan s (target met)",
        lambda r: f"{r.makespan_s:.2f}" + (f" ({r.target_s:.1f})" if r.target_s else ""),
    ),
    ("ideal s", lambda r: f"{r.ideal_makespan_s:.2f}"),
    ("efficiency", lambda r: f"{r.efficiency:.3f}"),
    ("FIFO bound s", lambda r: f"{r.fifo_makespan_s:.2f}"),
    ("client eff", lambda r: f"{r.client_efficiency:.3f}"),
    ("length / oracle s", lambda r: f"{r.length_makespan_s:.1f} / {r.oracle_makespan_s:.1f}"),
    ("KV bound s", lambda r: f"{r.kv_bound_makespan_s:.2f}" if r.kv_bound_makespan_s else "-"),
    ("groups 50/90/100% s", lambda r: _groups(r.groups_s)),
    ("traj/s", lambda r: f"{r.trajectories_per_s:.1f}"),
    ("tok/s", lambda r: f"{r.tokens_per_s:.0f}"),
    ("CPU ms/turn", lambda r: f"{r.cpu_per_turn_ms:.2f}"),
    ("services CPU s", lambda r: f"{r.services_cpu_s:.1f}"),
    (
        "peak MB; lag p99 ms",
        lambda r: f"{r.peak_rss_mb:.0f}; " + (f"{r.lag_ms['p99']:.0f}" if r.lag_ms else "-"),
    ),
    ("cached tok", lambda r: str(r.cached_tokens)),
    ("retracted", lambda r: f"{r.retractions}/{r.preemptions}"),
]
"""The table's columns: each one's header and how a mode's row fills it."""


def render_table(report: BenchReport, console: Any = None) -> None:
    """Print the modes side by side, then the targets, then the machine load."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title="toolrollout bench (same workload, same servers, one run)")
    for name, _ in _COLUMNS:
        table.add_column(name, justify="left" if name == "mode" else "right")
    for r in report.results:
        table.add_row(*(cell(r) for _, cell in _COLUMNS))
    console.print(table)
    targets = Table(title="targets")
    for column in ("target", "measured", "goal", "met"):
        targets.add_column(column)
    for t in report.targets():
        targets.add_row(t["target"], f"{t['value']:.3f}", t["goal"], "yes" if t["met"] else "NO")
    console.print(targets)
    machine = report.machine
    console.print(
        f"machine: {machine['cpus']} CPUs; load average before "
        f"{machine['loadavg_before'][0]:.2f}, after {machine['loadavg_after'][0]:.2f}"
    )


def _groups(groups: dict[str, float] | None) -> str:
    if not groups:
        return "-"
    return "/".join(f"{groups.get(k, 0.0):.1f}" for k in ("50", "90", "100"))


def _curve(groups: dict[str, float] | None) -> tuple[list[float], list[int]]:
    """The (seconds, percent complete) points of a run's group completion times."""
    points = sorted((int(k), v) for k, v in (groups or {}).items())
    return [v for _, v in points], [k for k, _ in points]


def plot_report(report: BenchReport, path: Path) -> Path:
    """Save a three-panel figure: throughput and efficiency per mode, time to complete GRPO
    groups (with the bounds), CPU per turn."""
    try:
        import matplotlib
    except ImportError as exc:
        from toolrollout._exceptions import UserError

        raise UserError(
            "the plot needs matplotlib: pip install 'toolrollout[bench]' (or leave out --plot)"
        ) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rollouts = [r for r in report.results if r.mode not in ("httpx", "aiohttp")]
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.5))
    names = [r.mode for r in rollouts]
    left.bar(names, [r.trajectories_per_s for r in rollouts], color="#4C72B0")
    left.set_ylabel("trajectories / s")
    left.set_ylim(0, max((r.trajectories_per_s for r in rollouts), default=1.0) * 1.3 or 1.0)
    left.set_title("throughput (bar) and efficiency (label)")
    for i, r in enumerate(rollouts):
        left.annotate(
            f"eff {r.efficiency:.2f}\nclient {r.client_efficiency:.2f}",
            (i, r.trajectories_per_s),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    left.tick_params(axis="x", labelrotation=20, labelsize=8)
    for r in rollouts:
        xs, ys = _curve(r.groups_s)
        middle.plot(xs, ys, marker="o", markersize=3, label=r.mode)
    ref = next((r for r in rollouts if r.oracle_groups_s), None)
    if ref is not None and ref.oracle_groups_s is not None:
        xs, ys = _curve(ref.oracle_groups_s)
        middle.plot(xs, ys, "k--", label=f"oracle bound ({ref.mode} work)")
        middle.axvline(ref.ideal_makespan_s, color="grey", linestyle=":", label="ideal makespan")
        if ref.kv_bound_makespan_s:
            middle.axvline(
                ref.kv_bound_makespan_s, color="tab:red", linestyle=":", label="KV bound"
            )
    middle.set_xlabel("seconds from the start")
    middle.set_ylabel("% of GRPO groups complete")
    middle.set_title("time to complete groups")
    middle.legend(fontsize=7)
    cpu_modes = list(report.results)
    right.tick_params(axis="x", labelrotation=20, labelsize=8)
    right.bar([r.mode for r in cpu_modes], [r.cpu_per_turn_ms for r in cpu_modes], color="#DD8452")
    right.set_ylabel("client CPU ms per turn")
    right.set_title("client CPU per turn (httpx, aiohttp: bare POSTs)")
    workload = report.config["workload"]
    model = report.config.get("model", {})
    tools = report.config["tool_latency"]
    load = report.machine["loadavg_before"][0]
    fig.suptitle(
        f"{workload['prompts']}x{workload['n']} trajectories, "
        f"{workload['min_turns']}-{workload['max_turns']} turns of "
        f"{workload.get('tokens_per_turn', '?')} tokens; "
        f"{report.config.get('servers', 1)} server(s) x {model.get('capacity', '?')} slots at "
        f"{1000 * float(model.get('decode_per_token_s', 0)):g} ms/token; tools "
        f"{tools['kind']} median {tools.get('median', '?')} s; "
        f"{report.machine['cpus']} CPUs, load {load:.1f}",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
