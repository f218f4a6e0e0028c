"""The import graph of ``src/toolrollout`` has no cycles, and the core never imports an app.

The graph is built from the source (AST), not from ``sys.modules``, so it counts every
import a module can run: top-level ones, function-local (lazy) ones and those under
``if TYPE_CHECKING:``. A lazy or type-only import hides a cycle from the interpreter, not
from a reader: the two modules still cannot be understood, tested or moved one without
the other.

Run this file as a script to print the graph's cycles with every edge's kind.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT_PACKAGE = "toolrollout"

EdgeKind = Literal["top", "lazy", "type_checking"]
Edge = tuple[str, str]

# Import edges that other slices of issue 16 are cutting concurrently, by cycle. The graph
# without these edges must be acyclic. The lead empties this after merging those slices;
# an edge may be added here only with the name of the change that removes it.
KNOWN_CYCLES_TO_CUT: dict[str, frozenset[Edge]] = {}

# The core: what a trainer imports. ``toolrollout.engines`` means the package and every
# module under it, less the prefixes in CORE_EXCLUDED.
CORE = (
    "toolrollout._exceptions",
    "toolrollout.exceptions",
    "toolrollout._extras",
    "toolrollout._jsonarg",
    "toolrollout._pacing",
    "toolrollout._records",
    "toolrollout._retry",
    "toolrollout.engines",
    "toolrollout.chat",
    "toolrollout.tools",
    "toolrollout.rollout",
    "toolrollout.rewards",
    "toolrollout.interactions",
    "toolrollout.metrics",
    "toolrollout.data",
    "toolrollout.spec",
)
CORE_EXCLUDED = ("toolrollout.engines.embedded",)

# Applications: servers, CLIs, benchmarks, demos, trainer adapters. They may import the core.
APPLICATIONS = (
    "toolrollout.engines.embedded",
    "toolrollout.apps",
    "toolrollout.sandbox",
    "toolrollout.search",
    "toolrollout.integrations",
)

# Core -> application edges that stay for now, each with its reason. Empty it as they go.
KNOWN_CORE_TO_APP: dict[Edge, str] = {
    ("toolrollout.engines._factory", "toolrollout.engines.embedded"): (
        "the engine factory starts the embedded engine for a model folder (lazy: torch loads "
        "only then, behind the 'serve' extra)"
    ),
    ("toolrollout.spec._spec", "toolrollout.apps.demo"): (
        "a run without --model uses the bundled demo model (lazy: only its path is read)"
    ),
    ("toolrollout.engines", "toolrollout.engines.embedded"): (
        "EmbeddedEngine is a lazy attribute of the engines package (torch loads on access "
        "only); the engine factory of the 'engines' slice may take its place"
    ),
}


@dataclass(frozen=True, slots=True)
class Import:
    """One import statement's edge: who imports what, where, and how it runs."""

    source: str
    target: str
    kind: EdgeKind
    line: int


def module_names(src: Path = SRC) -> dict[str, Path]:
    """Every module of the package, by dotted name (a package is its ``__init__``)."""
    names: dict[str, Path] = {}
    for path in sorted((src / ROOT_PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


class _Collector(ast.NodeVisitor):
    """Finds every import in one module and how it runs (top level, lazy, type only)."""

    def __init__(self, module: str, is_package: bool, modules: Mapping[str, Path]) -> None:
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.modules = modules
        self.found: list[Import] = []
        self._depth = 0  # function nesting
        self._type_only = 0  # `if TYPE_CHECKING:` nesting

    @property
    def _kind(self) -> EdgeKind:
        if self._type_only:
            return "type_checking"
        return "lazy" if self._depth else "top"

    def _nearest_module(self, name: str) -> str | None:
        while name:
            if name in self.modules:
                return name
            name = name.rpartition(".")[0]
        return None

    def _add(self, name: str, line: int) -> None:
        target = self._nearest_module(name)
        if target is not None and target != self.module:
            self.found.append(Import(self.module, target, self._kind, line))

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._nested(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._nested(node)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._nested(node)

    def _nested(self, node: ast.AST) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        self.visit(node.test)
        self._type_only += 1
        for stmt in node.body:
            self.visit(stmt)
        self._type_only -= 1
        for stmt in node.orelse:
            self.visit(stmt)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")
            if node.level > 1:
                base = base[: -(node.level - 1)]
            stem = ".".join([*base, node.module] if node.module else base)
        else:
            stem = node.module or ""
        # `from a.b import c`: an edge to the submodule `a.b.c` where `c` is one, and to
        # `a.b` itself where some name is not (it must run `a.b` to find that name)
        submodules = [f"{stem}.{a.name}" for a in node.names if f"{stem}.{a.name}" in self.modules]
        for submodule in submodules:
            self._add(submodule, node.lineno)
        if len(submodules) < len(node.names):
            self._add(stem, node.lineno)


def collect_imports(src: Path = SRC) -> list[Import]:
    """Every import between two modules of the package, counting lazy and type-only ones."""
    modules = module_names(src)
    found: list[Import] = []
    for name, path in modules.items():
        collector = _Collector(name, path.name == "__init__.py", modules)
        collector.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        found.extend(collector.found)
    return found


def strongly_connected(nodes: Iterable[str], edges: Iterable[Edge]) -> list[list[str]]:
    """The graph's cycles: its strongly connected components of two or more modules."""
    graph: dict[str, set[str]] = {node: set() for node in nodes}
    for source, target in edges:
        graph.setdefault(source, set()).add(target)
        graph.setdefault(target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):  # iterative Tarjan: the package is deep enough to matter
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return sorted(components)


def describe_cycles(imports: Iterable[Import], skip: frozenset[Edge] = frozenset()) -> list[str]:
    """One paragraph per cycle: its modules and every edge inside it, with kind and line."""
    imports = [i for i in imports if (i.source, i.target) not in skip]
    modules = module_names()
    cycles = strongly_connected(modules, ((i.source, i.target) for i in imports))
    text = []
    for component in cycles:
        members = set(component)
        where: dict[tuple[str, str, str], list[int]] = {}
        for i in imports:
            if {i.source, i.target} <= members:
                where.setdefault((i.source, i.target, i.kind), []).append(i.line)
        lines = [f"cycle of {len(component)} modules: {', '.join(component)}"]
        lines += [
            f"    {s} -> {t}  ({kind}, line {', '.join(map(str, sorted(at)))})"
            for (s, t, kind), at in sorted(where.items())
        ]
        text.append("\n".join(lines))
    return text


def _within(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def is_core(module: str) -> bool:
    return _within(module, CORE) and not _within(module, CORE_EXCLUDED)


def is_application(module: str) -> bool:
    return _within(module, APPLICATIONS)


# --- the tests -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return collect_imports()


def test_the_graph_sees_every_kind_of_import(imports: list[Import]) -> None:
    # guards the collector itself: a graph that lost the lazy or type-only edges would
    # pass the cycle test for the wrong reason
    kinds = {i.kind for i in imports}
    assert kinds == {"top", "lazy", "type_checking"}
    assert len(module_names()) > 100


def test_no_import_cycles(imports: list[Import]) -> None:
    allowed = frozenset().union(*KNOWN_CYCLES_TO_CUT.values())
    cycles = describe_cycles(imports, skip=allowed)
    assert not cycles, "import cycles (lazy and TYPE_CHECKING imports count):\n" + "\n".join(cycles)


def test_known_cycle_edges_still_exist(imports: list[Import]) -> None:
    # an allow-list entry whose edge is gone is stale: delete it so the list only shrinks
    edges = {(i.source, i.target) for i in imports}
    stale = sorted(e for cut in KNOWN_CYCLES_TO_CUT.values() for e in cut if e not in edges)
    assert not stale, f"edges in KNOWN_CYCLES_TO_CUT that no longer exist: {stale}"


def test_the_core_imports_no_application(imports: list[Import]) -> None:
    bad = sorted(
        {
            f"{i.source} -> {i.target}  ({i.kind}, line {i.line})"
            for i in imports
            if is_core(i.source)
            and is_application(i.target)
            and (i.source, i.target) not in KNOWN_CORE_TO_APP
        }
    )
    assert not bad, "the core imports an application:\n" + "\n".join(bad)


def test_known_core_to_app_edges_still_exist(imports: list[Import]) -> None:
    edges = {(i.source, i.target) for i in imports}
    stale = sorted(e for e in KNOWN_CORE_TO_APP if e not in edges)
    assert not stale, f"edges in KNOWN_CORE_TO_APP that no longer exist: {stale}"


# The bottom of the house: these import nothing of toolrollout but each other.
LEAVES = (
    "toolrollout._exceptions",
    "toolrollout._pacing",
    "toolrollout._records",
    "toolrollout._retry",
)
# Typed on the records alone: a reward function or a metric never needs the loop.
ON_RECORDS_ONLY = ("toolrollout.rewards", "toolrollout.metrics")


def test_leaves_import_only_leaves(imports: list[Import]) -> None:
    known = frozenset().union(*KNOWN_CYCLES_TO_CUT.values())
    bad = sorted(
        f"{i.source} -> {i.target}  ({i.kind}, line {i.line})"
        for i in imports
        if _within(i.source, LEAVES)
        and not _within(i.target, LEAVES)
        and (i.source, i.target) not in known
    )
    assert not bad, "a leaf module imports above itself:\n" + "\n".join(bad)


def test_rewards_and_metrics_import_only_the_records(imports: list[Import]) -> None:
    bad = sorted(
        f"{i.source} -> {i.target}  ({i.kind}, line {i.line})"
        for i in imports
        if _within(i.source, ON_RECORDS_ONLY) and not _within(i.target, (*LEAVES, *ON_RECORDS_ONLY))
    )
    assert not bad, "rewards/metrics import more than the records:\n" + "\n".join(bad)


def test_every_module_is_core_or_application_or_a_leaf() -> None:
    # a new top-level subpackage must be placed in one of the two lists (or be a leaf helper)
    leaves = {
        "toolrollout",
        "toolrollout.__main__",
        "toolrollout._http",
        "toolrollout._net",
        "toolrollout._port_records",
        "toolrollout._retrying_post",
        "toolrollout._security",
        "toolrollout._supervisor",
        "toolrollout._version",
        "toolrollout.testing",
    }
    unplaced = sorted(
        m for m in module_names() if not is_core(m) and not is_application(m) and m not in leaves
    )
    assert not unplaced, f"modules in neither CORE nor APPLICATIONS: {unplaced}"


# --- the checker checks itself on a small package -----------------------------------------


def _write_package(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / ROOT_PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_the_collector_resolves_relative_lazy_and_type_only_imports(tmp_path: Path) -> None:
    _write_package(
        tmp_path,
        {
            "__init__.py": "",
            "a/__init__.py": "from ._x import X\n",
            "a/_x.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from ..b import Y, y\n"
                "def f():\n    import toolrollout.b._z\n"
                "X = 1\n"
            ),
            "b/__init__.py": "from toolrollout import a\nY = 1\n",
            "b/y.py": "",
            "b/_z.py": "from toolrollout.a import _x\n",
        },
    )
    found = {(i.source, i.target, i.kind) for i in collect_imports(tmp_path)}
    assert found == {
        ("toolrollout.a", "toolrollout.a._x", "top"),
        ("toolrollout.a._x", "toolrollout.b", "type_checking"),
        ("toolrollout.a._x", "toolrollout.b.y", "type_checking"),
        ("toolrollout.a._x", "toolrollout.b._z", "lazy"),
        ("toolrollout.b", "toolrollout.a", "top"),
        ("toolrollout.b._z", "toolrollout.a._x", "top"),
    }
    edges = [(s, t) for s, t, _ in found]
    assert strongly_connected({s for s, _ in edges}, edges) == [
        ["toolrollout.a", "toolrollout.a._x", "toolrollout.b", "toolrollout.b._z"]
    ]


def test_strongly_connected_finds_each_cycle_apart() -> None:
    edges = [("a", "b"), ("b", "a"), ("b", "c"), ("c", "d"), ("d", "e"), ("e", "c"), ("e", "f")]
    assert strongly_connected("abcdef", edges) == [["a", "b"], ["c", "d", "e"]]
    assert strongly_connected("abc", [("a", "b"), ("b", "c")]) == []


if __name__ == "__main__":
    everything = collect_imports()
    report = describe_cycles(everything)
    sys.stdout.write("\n\n".join(report) or "no cycles")
    sys.stdout.write(
        f"\n\n{len(report)} cycles, {len(module_names())} modules, {len(everything)} imports\n"
    )
    sys.exit(1 if report else 0)
