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


#: The gRPC plugin's code that both wings use: the channel per process, TLS and tokens
#: (``transport``, ``tls_check``), endpoints and file checks (``options``).
GRPC_SHARED = {"rallypoint_grpc", "rallypoint_grpc.transport", "rallypoint_grpc.tls_check", "rallypoint_grpc.options"}


def test_the_grpc_plugins_rpc_wing_and_its_rendezvous_modules_share_only_the_channel_code() -> None:
    (grpc,) = [d for d in distributions() if d.folder.name == "rallypoint-grpc"]
    graph = edges(grpc)
    wing = {m for m in graph if m == "rallypoint_grpc.rpc" or m.startswith("rallypoint_grpc.rpc.")}
    assert "rallypoint_grpc.rpc.transport" in wing
    outside = {m for m in graph if m not in wing and m not in GRPC_SHARED and m != "rallypoint_grpc.hooks"}
    assert {m: sorted(graph[m] & outside) for m in wing if graph[m] & outside} == {}
    assert {m: sorted(graph[m] & wing) for m in outside | GRPC_SHARED if graph[m] & wing} == {}
