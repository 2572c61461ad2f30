"""The package's import graph: no cycles between modules (imports inside functions count), and the
layers stay apart (the core knows no policy, engine or topology; policies know no topology).

Every ``import`` statement of every module is read with :mod:`ast`, at any depth (module level,
inside functions and methods), except those under ``if TYPE_CHECKING:``, which never run. An
import of ``a.b.c`` is an edge to the module ``a.b.c``; ``from a.b import c`` is an edge to
``a.b.c`` when that is a module, else to ``a.b``. A cycle is any strongly connected component
with more than one module, or a module importing itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import servesim

ROOT = Path(servesim.__file__).resolve().parent.parent
PACKAGES = {"servesim": ROOT / "simulator", "servesim.policies": ROOT / "policies",
            "servesim.workloads": ROOT / "workloads", "servesim.calibration": ROOT / "calibration"}


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package is its ``__init__``)."""
    found: dict[str, Path] = {}
    for prefix, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join((prefix, *parts))
            if prefix == "servesim" and name.split(".")[1:2] in (["policies"], ["workloads"],
                                                                  ["calibration"]):
                continue  # not inside simulator/
            found[name] = path
    return found


def _runtime_imports(tree: ast.Module) -> list[str]:
    """Names imported by statements that run (not under ``if TYPE_CHECKING:``)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for statement in node.body for child in ast.walk(statement))
    names = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
    return names


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for imported in _runtime_imports(tree):
            if imported in modules and imported != name:
                graph[name].add(imported)
        # ``from a.b import c``: the edge to a.b counts only when c is not a module of it
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in modules and all(
                    f"{node.module}.{alias.name}" in modules for alias in node.names):
                graph[name].discard(node.module) if not _imports_module_itself(tree, node.module) else None
    return graph


def _imports_module_itself(tree: ast.Module, module: str) -> bool:
    return any(isinstance(n, ast.Import) and any(a.name == module for a in n.names) for n in ast.walk(tree))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for child in sorted(graph[node]):
            if child not in index:
                visit(child)
                low[node] = min(low[node], low[child])
            elif child in on_stack:
                low[node] = min(low[node], index[child])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_covers_the_package() -> None:
    graph = import_graph()
    assert {"servesim.core.replica", "servesim.policies.continuous", "servesim.topology.disaggregated",
            "servesim.engines.vllm_v0", "servesim.pipeline.simulate"} <= graph.keys()
    assert "servesim.core.replica_state" in graph["servesim.policies.continuous"] or \
        "servesim.core.kv_cache" in graph["servesim.policies.continuous"]


def test_no_import_cycles_even_counting_imports_inside_functions() -> None:
    assert cycles(import_graph()) == []


def test_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


def _reaches(graph: dict[str, set[str]], start: str, prefix: str) -> list[str]:
    seen, todo, hits = set(), [start], []
    while todo:
        node = todo.pop()
        for child in graph[node]:
            if child not in seen:
                seen.add(child)
                todo.append(child)
                if child.startswith(prefix):
                    hits.append(child)
    return hits


def test_layers_the_core_knows_no_policy_engine_or_topology() -> None:
    """The simulation core runs the policies and topologies it is given; it imports none of them,
    nor the pipeline, config or CLI above it, and no engine (an engine reaches it only as the cost
    model's step price). Policies decide over the core and import no topology."""
    graph = import_graph()
    core = [name for name in graph if name.startswith("servesim.core")]
    for module in core:
        for layer in ("servesim.policies", "servesim.topology", "servesim.pipeline", "servesim.config",
                      "servesim.cli", "servesim.report", "servesim.sweep", "servesim.capacity"):
            assert not _reaches(graph, module, layer), (module, layer)
        assert not any(name.startswith("servesim.engines") for name in graph[module]), module
    for module in (name for name in graph if name.startswith("servesim.policies")):
        assert not _reaches(graph, module, "servesim.topology"), module
        assert not _reaches(graph, module, "servesim.pipeline"), module


def test_the_wheel_lists_every_subpackage() -> None:
    """setuptools installs only the packages pyproject.toml names: a new folder of the package
    that is not listed would be missing from a wheel (the editable install would hide it)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {name for name, path in _modules().items() if path.name == "__init__.py"}
    assert found <= listed, sorted(found - listed)
