"""Plot the 10,000-trajectory runs: what the client holds as its trajectories grow.

    python benchmarks/plot_scale.py benchmarks/results/scale_quiet_011f4a5.json \
        --out docs/benchmarks_scale.png

The file holds one ``bench_scale.py`` report per shape (keys ``long`` and ``short``). Left:
the RSS the run added against the tokens held, sampled every two seconds, with the
16-bytes-a-token goal through the origin; the straight stretch is the ramp where every
trajectory is live and none has finished, and its slope is the cost of one more held
token. Right: the same samples as bytes per held token over the run, where the fixed cost
of a live trajectory shows as the distance between the two shapes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

_GOAL_BYTES = 16.0
_LABELS = {"long": "6 turns x 1,024 tokens", "short": "6 turns x 128 tokens"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--out", type=Path, default=Path("benchmarks_scale.png"))
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run: dict[str, Any] = json.loads(args.run.read_text())
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    most_tokens = 0.0
    for i, shape in enumerate(("long", "short")):
        if shape not in run:
            continue
        report = run[shape]
        ticks = [t for t in report["ticks"] if t["held_tokens"] > 0]
        held = [t["held_tokens"] / 1e6 for t in ticks]
        added = [t["rss_added"] / 1e6 for t in ticks]
        most_tokens = max(most_tokens, *held)
        peak = report["rss_bytes_per_held_token_in_flight"]
        lag = report["lag_ms"]["p99"]
        label = f"{_LABELS[shape]}: {peak:.1f} B/token in flight, lag p99 {lag:.1f} ms"
        left.plot(held, added, ".", color=f"C{i}", markersize=4, label=label)
        right.plot(
            [t["t"] for t in ticks],
            [t["rss_added"] / t["held_tokens"] for t in ticks],
            "-",
            color=f"C{i}",
            label=_LABELS[shape],
        )
    left.plot([0, most_tokens], [0, most_tokens * _GOAL_BYTES], "k--", label="goal: 16 B/token")
    left.set_xlabel("tokens held (millions)")
    left.set_ylabel("RSS added (MB)")
    left.set_title("10,000 trajectories in one process")
    left.legend(fontsize=7, loc="upper left")
    right.axhline(_GOAL_BYTES, color="k", linestyle="--", label="goal")
    right.set_ylim(0, 120)
    right.set_xlabel("seconds into the run")
    right.set_ylabel("RSS added per held token (bytes)")
    right.set_title("per held token, as the trajectories grow")
    right.legend(fontsize=7)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
