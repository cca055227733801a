"""The import graph among nasctl's modules has no cycle and no import back up the layers.

Every `import` and `from ... import` counts, at module level or inside a function (a
function-level import is still a dependency; it only runs later).  Relative imports are
resolved against the importing module's package.  `from PKG import NAME` depends on the
module PKG.NAME where there is one, else on PKG.  Importing a submodule also runs its
package's `__init__`, but that implicit edge is not counted: every package would then
form a cycle with any submodule its `__init__` imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import nasctl

PACKAGE = Path(nasctl.__file__).resolve().parent

# Cycles left to fix in files outside this test's reach; each entry must still be a
# cycle (so a fixed one is removed from here), and no other cycle may appear.
KNOWN_CYCLES: set[frozenset[str]] = set()


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package at `root`."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def import_graph(root: Path, package: str) -> dict[str, dict[str, int]]:
    """For every module of the package: the package's modules it imports, each with the
    line of its first import."""
    modules = module_files(root, package)

    def owner(name: str) -> str | None:
        """The package's module a dotted name lives in (a module, or a name inside one)."""
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    if node.level - 1 > len(base) - 1:
                        raise AssertionError(f"{path}:{node.lineno}: relative import beyond the top package")
                    base = base[:len(base) - (node.level - 1)]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                targets = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                           for alias in node.names]
            for target in targets:
                found = owner(target)
                if found is not None and found != module:
                    edges.setdefault(found, node.lineno)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, {}))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def describe(graph: dict[str, dict[str, int]], component: frozenset[str]) -> str:
    edges = [f"{a} -> {b} (line {line})" for a in sorted(component) for b, line in graph[a].items() if b in component]
    return "; ".join(edges)


@pytest.fixture(scope="module")
def graph():
    return import_graph(PACKAGE, "nasctl")


def test_the_graph_resolves_relative_function_level_and_package_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .low import VALUE\n")
    (pkg / "low.py").write_text("import os\nVALUE = 1\n")
    (pkg / "sub" / "__init__.py").write_text("from .. import low\nfrom . import leaf\n")
    (pkg / "sub" / "leaf.py").write_text("def f():\n    from ..low import VALUE\n    import pkg.sub.other\n")
    (pkg / "sub" / "other.py").write_text("from pkg.sub.leaf import f\nfrom pkg import VALUE\n")
    graph = import_graph(pkg, "pkg")
    assert graph == {"pkg": {"pkg.low": 1}, "pkg.low": {}, "pkg.sub": {"pkg.low": 1, "pkg.sub.leaf": 2},
                     "pkg.sub.leaf": {"pkg.low": 2, "pkg.sub.other": 3},
                     "pkg.sub.other": {"pkg.sub.leaf": 1, "pkg": 2}}
    assert cycles(graph) == [frozenset({"pkg.sub.leaf", "pkg.sub.other"})]


def test_every_module_is_in_the_graph(graph):
    assert len(graph) > 50 and "nasctl.config" in graph and "nasctl.hardware.measure.profile" in graph
    assert any(graph.values())


def test_no_import_cycles(graph):
    found = cycles(graph)
    new = [describe(graph, c) for c in found if c not in KNOWN_CYCLES]
    assert not new, "import cycles: " + " | ".join(new)
    fixed = [sorted(c) for c in KNOWN_CYCLES if c not in found]
    assert not fixed, f"no longer cycles, remove them from KNOWN_CYCLES: {fixed}"


@pytest.mark.parametrize("importer, imported", [
    ("nasctl.config", "nasctl.store"),
    ("nasctl.config", "nasctl.tables"),
    ("nasctl.hardware.fit", "nasctl.spaces.loader"),
    ("nasctl.predictors.zero_cost", "nasctl.predictors.base"),
    ("nasctl.spaces.nb201_torch", "nasctl.spaces.nb201"),
])
def test_no_import_back_up_the_layers(graph, importer, imported):
    assert imported not in graph[importer], f"{importer} imports {imported} (line {graph[importer][imported]})"


def test_hardware_does_not_import_search_spaces(graph):
    # Spaces emit LayerSpecs for the cost models; the cost models know nothing of spaces.
    up = {f"{m} -> {t}" for m, edges in graph.items() if m.startswith("nasctl.hardware")
          for t in edges if t.startswith("nasctl.spaces")}
    assert not up
