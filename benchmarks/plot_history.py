"""Plot the history policy's runs side by side: efficiency per mode on three workloads.

    python benchmarks/plot_history.py benchmarks/results/rollout_history_published.json \
        benchmarks/results/rollout_history_spread1.json \
        benchmarks/results/rollout_history_spread0.json --out docs/benchmarks_history.png

Each file is one ``bench_rollout.py`` run (``--previous-steps 1``). Bars are the measured
efficiency (ideal makespan / makespan) of each mode; the dashes are the same run's FIFO,
length and oracle replays of the FIFO mode's logged work, as efficiencies.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

_WORKLOAD = {
    -1: "lengths drawn per sample\n(published)",
    1: "prompt's length ±1",
    0: "prompt's length",
}
_MODES = ("toolrollout", "toolrollout:priority", "toolrollout:history")
_LABELS = {
    "toolrollout": "no policy (FIFO server)",
    "toolrollout:priority": "priority: fewest turns done",
    "toolrollout:history": "priority: history",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("benchmarks_history.png"))
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs: list[dict[str, Any]] = [json.loads(path.read_text()) for path in args.runs]
    fig, ax = plt.subplots(figsize=(9, 4.8))
    width = 0.26
    labelled: set[str] = set()
    for i, run in enumerate(runs):
        results = {r["mode"]: r for r in run["results"]}
        base = results["toolrollout"]
        for j, mode in enumerate(_MODES):
            if mode not in results:
                continue
            r = results[mode]
            x = i + (j - 1) * width
            eff = r["ideal_makespan_s"] / r["makespan_s"]
            label = None if mode in labelled else _LABELS[mode]
            labelled.add(mode)
            ax.bar(x, eff, width * 0.9, color=f"C{j}", label=label)
            ax.text(x, eff + 0.01, f"{eff:.2f}", ha="center", fontsize=8)
        for name, key, style in (
            ("FIFO replay", "fifo_makespan_s", "k:"),
            ("length replay", "length_makespan_s", "k--"),
            ("oracle replay", "oracle_makespan_s", "k-"),
        ):
            value = base["ideal_makespan_s"] / base[key]
            ax.plot([i - 1.5 * width, i + 1.5 * width], [value] * 2, style, lw=1.2,
                    label=name if i == 0 else None)  # fmt: skip
    ax.axhline(0.95, color="red", lw=0.8, alpha=0.6, label="target 0.95")
    ax.set_xticks(range(len(runs)))
    ax.set_xticklabels(
        [_WORKLOAD.get(run["config"]["workload"]["turn_spread"], "?") for run in runs]
    )
    ax.set_ylim(0.6, 1.02)
    ax.set_ylabel("efficiency (ideal / makespan)")
    ax.set_title("1,024 trajectories, one 256-slot server, the step after a previous one")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
