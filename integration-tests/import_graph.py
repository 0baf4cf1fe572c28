"""The import graph of the sources, read from their text (nothing is imported).

A module's edges are every ``import`` and ``from ... import`` it holds: at module level, inside
functions (an import moved into a function to dodge a circle is still a circle) and under
``if TYPE_CHECKING:`` (two modules that need each other's types are one job or share a third
module). ``from package import name`` is an edge to the submodule ``package.name`` when one
exists, else to the package's ``__init__``.
Only edges between modules of the same distribution are kept: the layering between distributions
is held by the distributions test.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Distribution:
    """One pip-installable distribution: its folder and the modules under its ``src``."""

    folder: Path
    modules: dict[str, Path]


def distributions() -> list[Distribution]:
    """Every distribution under ``packages/`` and ``plugins/`` with its modules by dotted name."""
    found = []
    for folder in sorted([*ROOT.glob("packages/*"), *ROOT.glob("plugins/*")]):
        src = folder / "src"
        if not src.is_dir():
            continue
        modules = {}
        for path in sorted(src.glob("**/*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if "_proto" in parts:  # generated protobuf code
                continue
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
        found.append(Distribution(folder, modules))
    return found


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of the module, wherever it sits."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The dotted name a (possibly relative) ``from`` import refers to."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def edges(dist: Distribution) -> dict[str, set[str]]:
    """For each module of ``dist``, the modules of ``dist`` it imports."""
    graph: dict[str, set[str]] = {}
    for module, path in dist.modules.items():
        targets: set[str] = set()
        for node in _imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = _absolute(module, path, node)
                names = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in dist.modules else base for alias in node.names
                ]
            targets.update(name for name in names if name in dist.modules and name != module)
        graph[module] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found
