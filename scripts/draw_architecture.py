"""Draw docs/architecture.png: the layers of src/toolrollout from its real import graph.

The boxes are the subpackages, placed in the layer docs/architecture.md assigns them; the
number under each name is its size in lines; the arrows are the import edges between
layers (lazy and TYPE_CHECKING imports included), thicker for more edges. Every arrow must
point down: tests/test_import_graph.py fails otherwise, so the picture and the test agree.

    python scripts/draw_architecture.py            # writes docs/architecture.png
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "toolrollout"

# Top layer first. A subpackage not listed here goes to the applications row.
LAYERS: list[tuple[str, list[str]]] = [
    (
        "applications",
        [
            "cli",
            "engines.embedded",
            "server",
            "sandbox",
            "search",
            "mcp_servers",
            "bench",
            "eval",
            "distributed",
            "demo",
            "demo_vl",
        ],
    ),
    ("integrations", ["integrations", "testing"]),
    ("composition root and loop", ["spec", "rollout"]),
    (
        "engines, chat, tools",
        ["engines", "chat", "tools", "rewards", "interactions", "metrics", "data"],
    ),
    ("records", ["_records", "exceptions", "_extras", "_version", "_retry", "_http", "_net"]),
]


def unit_of(module: str) -> str:
    """The box a module belongs to (``toolrollout.x.y`` -> ``x``, embedded engine apart)."""
    parts = module.split(".")[1:]
    if parts[:2] == ["engines", "embedded"]:
        return "engines.embedded"
    if not parts:
        return "toolrollout"
    name = parts[0]
    return "exceptions" if name == "_exceptions" else name


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def unit_edges(found: dict[str, Path]) -> tuple[Counter[tuple[str, str]], Counter[str]]:
    edges: Counter[tuple[str, str]] = Counter()
    sizes: Counter[str] = Counter()
    for name, path in found.items():
        text = path.read_text()
        sizes[unit_of(name)] += len(text.splitlines())
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(text)):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                targets = [".".join([*base, *([node.module] if node.module else [])])]
            for target in targets:
                if target.startswith("toolrollout.") and target in found:
                    a, b = unit_of(name), unit_of(target)
                    if a != b:
                        edges[(a, b)] += 1
    return edges, sizes


def draw(out: Path) -> None:
    found = modules()
    edges, sizes = unit_edges(found)
    placed = {u for _, units in LAYERS for u in units}
    extra = sorted(u for u in sizes if u not in placed and u not in {"toolrollout", "__main__"})
    layers = [(title, [u for u in units if u in sizes]) for title, units in LAYERS]
    layers[0][1].extend(extra)
    width, row_h, box_h = 15.0, 1.9, 0.9
    fig, ax = plt.subplots(figsize=(width, row_h * len(layers) + 0.6))
    centers: dict[str, tuple[float, float]] = {}
    layer_of: dict[str, int] = {}
    colours = ["#f4d6cc", "#f7e8c6", "#d9ead3", "#cfe2f3", "#e0d7ee"]
    for row, (title, units) in enumerate(layers):
        y = (len(layers) - 1 - row) * row_h
        ax.add_patch(
            FancyBboxPatch(
                (0.05, y - 0.15),
                width - 0.1,
                row_h - 0.4,
                boxstyle="round,pad=0.02",
                fc=colours[row % 5],
                ec="none",
                alpha=0.5,
            )
        )
        ax.text(0.2, y + row_h - 0.72, title, fontsize=10, style="italic", color="#444")
        step = (width - 2.6) / max(len(units), 1)
        for i, unit in enumerate(units):
            x = 2.4 + i * step
            w = min(step - 0.15, 1.9)
            ax.add_patch(
                FancyBboxPatch((x, y), w, box_h, boxstyle="round,pad=0.03", fc="white", ec="#333")
            )
            ax.text(
                x + w / 2,
                y + 0.58,
                unit.replace("engines.", ""),
                ha="center",
                fontsize=8.5,
                weight="bold",
            )
            ax.text(
                x + w / 2,
                y + 0.22,
                f"{sizes[unit]:,} lines",
                ha="center",
                fontsize=7.5,
                color="#555",
            )
            centers[unit] = (x + w / 2, y)
            layer_of[unit] = row
    upward = 0
    for (a, b), count in sorted(edges.items()):
        if a not in centers or b not in centers or layer_of[a] == layer_of[b]:
            continue
        going_down = layer_of[b] > layer_of[a]
        upward += not going_down
        (xa, ya), (xb, yb) = centers[a], centers[b]
        ax.add_patch(
            FancyArrowPatch(
                (xa, ya),
                (xb, yb + box_h),
                arrowstyle="-|>",
                mutation_scale=8,
                lw=0.4 + 0.15 * min(count, 12),
                color="#8a8a8a" if going_down else "#d62728",
                alpha=0.45 if going_down else 0.9,
            )
        )
    ax.set_xlim(0, width)
    ax.set_ylim(-0.3, row_h * len(layers))
    ax.axis("off")
    ax.set_title(
        "toolrollout layers: imports between subpackages"
        + ("" if not upward else f" ({upward} upward, in red)"),
        fontsize=12,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(
        f"wrote {out} ({len(found)} modules, {sum(edges.values())} cross-box imports, "
        f"{upward} upward)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "architecture.png")
    draw(parser.parse_args().out)


if __name__ == "__main__":
    main()
