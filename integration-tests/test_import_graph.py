"""No import circles inside any distribution (the house issue, #37).

Two modules that import each other, directly or round a longer loop, are one job split badly or
two jobs tangled: whoever reads one must read the other, and the order in which Python runs them
decides what works. The graph is read from the sources' text (:mod:`import_graph`), with every
import counted: at module level, in functions and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from import_graph import Distribution, circles, distributions, edges


def test_every_distribution_was_read() -> None:
    found = {d.folder.name: len(d.modules) for d in distributions()}
    assert set(found) >= {
        "rallypoint-core",
        "rallypoint-rendezvous",
        "rallypoint-agent",
        "rallypoint-timer",
        "rallypoint-collectives",
        "rallypoint-rpc",
        "rallypoint-grpc",
        "rallypoint-etcd",
        "rallypoint-file",
    }
    assert all(count > 0 for count in found.values()), found


def test_no_distribution_has_an_import_circle() -> None:
    found = {d.folder.name: circles(edges(d)) for d in distributions()}
    assert {name: loops for name, loops in found.items() if loops} == {}


def _fake(tmp_path: Path, sources: dict[str, str]) -> Distribution:
    modules = {}
    for name, text in sources.items():
        path = tmp_path / (name.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        modules[name.removesuffix(".__init__")] = path
    return Distribution(tmp_path, modules)


def test_the_check_sees_circles_in_functions_relative_imports_and_type_checking(tmp_path: Path) -> None:
    dist = _fake(
        tmp_path,
        {
            "pkg.__init__": "from pkg.a import A\n",
            "pkg.a": "from . import b\nA = 1\n",
            "pkg.b": "def f():\n    from pkg import c\n",
            "pkg.c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n",
            "pkg.d": "import pkg.a\n",
        },
    )
    assert edges(dist)["pkg.b"] == {"pkg.c"}
    assert circles(edges(dist)) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_the_check_passes_a_one_way_graph_and_ignores_other_distributions(tmp_path: Path) -> None:
    dist = _fake(
        tmp_path,
        {
            "pkg.__init__": "import os\nfrom rallypoint.core import plugins\n",
            "pkg.a": "from pkg import b\n",
            "pkg.b": "import json\n",
        },
    )
    assert circles(edges(dist)) == []


#: The gRPC plugin's top level: the package (its fork-safety setting), the hooks that register both
#: wings, and the code both wings stand on (the channel per process, TLS and tokens: ``transport``;
#: ``HOST:PORT``: ``endpoints``; the token and TLS options: ``security``). Any other module belongs
#: in a wing; a new shared one goes here, and only if both wings use it.
GRPC_TOP = {
    "rallypoint_grpc",
    "rallypoint_grpc.hooks",
    "rallypoint_grpc.transport",
    "rallypoint_grpc.endpoints",
    "rallypoint_grpc.security",
}
#: The wings: the rendezvous backend (client, server, store) and the RPC transport.
GRPC_WINGS = ("rallypoint_grpc.rendezvous", "rallypoint_grpc.rpc")


def _wing(module: str) -> str | None:
    return next((w for w in GRPC_WINGS if module == w or module.startswith(w + ".")), None)


def _reached(graph: dict[str, set[str]], start: set[str]) -> set[str]:
    seen, todo = set(), list(start)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return seen


def grpc_layout_problems(graph: dict[str, set[str]]) -> list[str]:
    """What breaks the gRPC plugin's layout of two wings over shared code; empty when none."""
    shared = GRPC_TOP - {"rallypoint_grpc.hooks"}
    problems = [f"{m}: neither shared nor in a wing" for m in sorted(graph) if m not in GRPC_TOP and not _wing(m)]
    for module in sorted(set(graph) - {"rallypoint_grpc.hooks"}):  # the hooks register both wings
        wing = _wing(module)
        allowed = shared | ({m for m in graph if _wing(m) == wing} if wing else set())
        problems += [f"{module} imports {target}" for target in sorted(graph[module] - allowed)]
    for wing in GRPC_WINGS:
        used = _reached(graph, {m for m in graph if _wing(m) == wing})
        problems += [f"{wing} never uses the shared {m}" for m in sorted(shared - used - {"rallypoint_grpc"})]
    return problems


def test_the_grpc_plugin_is_two_wings_over_shared_code_and_neither_wing_imports_the_other() -> None:
    (grpc,) = [d for d in distributions() if d.folder.name == "rallypoint-grpc"]
    graph = edges(grpc)
    assert {"rallypoint_grpc.rpc.transport", "rallypoint_grpc.rendezvous.backend"} <= set(graph)
    assert grpc_layout_problems(graph) == []


def test_the_grpc_layout_check_refuses_a_module_at_the_top_and_a_wing_importing_the_other() -> None:
    good = {
        "rallypoint_grpc": set(),
        "rallypoint_grpc.hooks": {"rallypoint_grpc.rendezvous.options", "rallypoint_grpc.rpc.options"},
        "rallypoint_grpc.transport": {"rallypoint_grpc.endpoints"},
        "rallypoint_grpc.endpoints": set(),
        "rallypoint_grpc.security": set(),
        "rallypoint_grpc.rendezvous.options": {"rallypoint_grpc.security", "rallypoint_grpc.endpoints"},
        "rallypoint_grpc.rendezvous.backend": {"rallypoint_grpc.rendezvous.options", "rallypoint_grpc.transport"},
        "rallypoint_grpc.rpc.options": {"rallypoint_grpc.security"},
        "rallypoint_grpc.rpc.transport": {"rallypoint_grpc.rpc.options", "rallypoint_grpc.transport"},
    }
    assert grpc_layout_problems(good) == []
    back_at_the_top = {**good, "rallypoint_grpc.store": set()}
    assert grpc_layout_problems(back_at_the_top) == ["rallypoint_grpc.store: neither shared nor in a wing"]
    crossing = {**good, "rallypoint_grpc.rpc.options": {"rallypoint_grpc.security", "rallypoint_grpc.rendezvous.store"}}
    assert grpc_layout_problems(crossing) == ["rallypoint_grpc.rpc.options imports rallypoint_grpc.rendezvous.store"]
    shared_on_a_wing = {**good, "rallypoint_grpc.transport": {"rallypoint_grpc.rendezvous.options"}}
    assert "rallypoint_grpc.transport imports rallypoint_grpc.rendezvous.options" in grpc_layout_problems(
        shared_on_a_wing
    )
    one_wing_only = {**good, "rallypoint_grpc.rpc.options": set()}
    assert grpc_layout_problems(one_wing_only) == ["rallypoint_grpc.rpc never uses the shared rallypoint_grpc.security"]
