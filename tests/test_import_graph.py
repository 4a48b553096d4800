"""The source tree's import graph has no circle: each module can be understood, and loaded,
after the ones it imports (a circle also hides behind ``TYPE_CHECKING``, which is counted:
the types are part of what a reader must follow)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("quotastream", "state", "streaming")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The project modules ``path`` imports (a ``from package import name`` names a module when
    that module exists)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in modules else node.module)
    return {name for name in found if name in modules}


def import_graph() -> dict[str, set[str]]:
    paths = [path for package in PACKAGES for path in (ROOT / package).rglob("*.py")]
    modules = {module_name(path) for path in paths}
    return {module_name(path): imports_of(path, modules) for path in paths}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan's algorithm), and every
    module that imports itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1 or module in graph[module]:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_circles_are_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert sorted(circles(graph)) == [["a", "b", "c"], ["e"]]


def test_the_source_tree_imports_in_no_circle() -> None:
    graph = import_graph()
    assert "quotastream.proxy.connection" in graph
    assert circles(graph) == []
