"""What ``rallypoint status`` shows: a snapshot of a job read from its rendezvous backend.

:func:`snapshot` reads the round header, the members' join records, the restart count and the
published worker failures, and returns plain data (``--json`` prints it as it is).
:func:`render` turns it into the table ``status`` prints, and :func:`watch` redraws it until the
job is closed. Only reads: a job is never changed by watching it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rallypoint.rendezvous.backend import RendezvousBackend

__all__ = ["render", "snapshot", "watch"]


def _header(backend: RendezvousBackend) -> Any:
    """The round header with its participants (resolved from the roster where the backend has one)."""
    from rallypoint.rendezvous import round_io
    from rallypoint.rendezvous.state import HEADER_KEY, Header

    read_header = getattr(round_io, "read_header", None)
    if read_header is not None:
        return read_header(backend)[0]
    entry = backend.get(HEADER_KEY)
    return Header.from_json(entry.value) if entry is not None else Header()


def _nodes(backend: RendezvousBackend, header: Any) -> list[dict[str, Any]]:
    from rallypoint.rendezvous.keyspace import JoinRecord, join_key

    nodes = []
    first = 0
    for group_rank, member in enumerate(header.participants):
        entry = backend.get(join_key(header.round, member.node_id))
        node = JoinRecord.from_json(entry.value).node if entry is not None else None
        workers = node.local_world_size if node is not None else 0
        nodes.append(
            {
                "group_rank": group_rank,
                "node_id": member.node_id,
                "host": node.host if node is not None else None,
                "addr": node.addr if node is not None else None,
                "workers": workers,
                "ranks": list(range(first, first + workers)),
            }
        )
        first += workers
    return nodes


def _state(header: Any) -> str:
    if header.closed:
        return "failed" if header.failed else "succeeded"
    return "running" if header.complete else "gathering nodes"


def snapshot(backend: RendezvousBackend, run_id: str) -> dict[str, Any] | None:
    """The job as plain data; ``None`` when the backend holds nothing under ``run_id``.

    Keys: ``run_id``, ``round``, ``state`` (``"gathering nodes"``, ``"running"``,
    ``"succeeded"``, ``"failed"``), ``closed``, ``succeeded`` (``None`` while it runs),
    ``reason``, ``nodes`` (group rank, node id, host, address, workers, global ranks under the
    default strategy), ``joined``, ``waiting``, ``restarts``, ``failures`` (one per failed
    worker: attempt, node, rank, reason) and ``ranks`` (``rank -> "running" | "failed" |
    "succeeded"``...).
    """
    from rallypoint.rendezvous.state import HEADER_KEY, count_key

    if backend.get(HEADER_KEY) is None and backend.get(count_key(0)) is None:
        return None
    header = _header(backend)
    restarts = backend.get("agent/restarts")
    joined = backend.get(count_key(header.round))
    waiting = backend.get(count_key(header.round + 1))
    failures = []
    for key, entry in sorted(backend.list("agent/failures/").items()):
        parts = key.split("/")
        try:
            data = entry.value if isinstance(entry.value, dict) else json.loads(entry.value)
        except (TypeError, ValueError):
            data = {}
        failures.append({"key": key, "attempt": data.get("attempt", parts[-3] if len(parts) >= 3 else None),
                         "node_id": data.get("node_id"), "rank": data.get("rank"),
                         "reason": data.get("reason")})  # fmt: skip
    nodes = _nodes(backend, header) if header.complete else []
    state = _state(header)
    restart_count = int(restarts.value) if restarts else 0
    failed_now = {f["rank"] for f in failures if str(f["attempt"]) == str(restart_count)}
    per_rank = "succeeded" if state == "succeeded" else ("stopped" if state == "failed" else "running")
    return {
        "run_id": run_id,
        "round": header.round,
        "state": state,
        "closed": header.closed,
        "succeeded": (not header.failed) if header.closed else None,
        "reason": header.reason,
        "nodes": nodes,
        "joined": int(joined.value) if joined else 0,
        "waiting": int(waiting.value) if waiting else 0,
        "restarts": restart_count,
        "failures": failures,
        "ranks": {r: ("failed" if r in failed_now else per_rank) for n in nodes for r in n["ranks"]},
    }


def render(snap: dict[str, Any], limits: str = "") -> str:
    """The snapshot as the table ``rallypoint status`` prints."""
    shown = "closed" if snap["closed"] else snap["state"]
    lines = [f"run:       {snap['run_id']}", f"round:     {snap['round']} ({shown})"]
    if snap["closed"]:
        outcome = "succeeded" if snap["succeeded"] else "failed"
        reason = snap["reason"] or "closed"
        lines.append(f"ended:     {reason}" + ("" if f"job {outcome}" in reason else f" ({outcome})"))
    if snap["nodes"]:
        lines.append(f"members:   {len(snap['nodes'])}")
        for node in snap["nodes"]:
            ranks = ", ".join(f"{r} {snap['ranks'].get(r, '?')}" for r in node["ranks"])
            lines.append(f"  {node['group_rank']}: {node['node_id']}  host {node['host'] or '?'}, "
                         f"{node['workers']} worker(s): {ranks or '-'}")  # fmt: skip
        lines.append(f"waiting:   {snap['waiting']}")
    else:
        lines.append(f"joined:    {snap['joined']}{limits}")
    lines.append(f"restarts:  {snap['restarts']}")
    lines.append(f"failures:  {len(snap['failures'])}")
    for failure in snap["failures"][-5:]:
        lines.append(f"  attempt {failure['attempt']}: rank {failure['rank']} on {failure['node_id']}: "
                     f"{failure['reason']}")  # fmt: skip
    return "\n".join(lines)


def watch(
    read: Callable[[], dict[str, Any] | None],
    show: Callable[[str, bool], None],
    *,
    interval: float = 1.0,
    limits: str = "",
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any] | None:
    """Show the job every ``interval`` seconds until it is closed; return the last snapshot.

    ``show(text, changed)`` gets each table (``changed`` is false when nothing moved since the
    last one, so a log can skip it while a terminal redraws).
    """
    last = None
    while True:
        snap = read()
        text = render(snap, limits) if snap is not None else "no rendezvous state yet (waiting for the first node)"
        show(text, text != last)
        last = text
        if snap is not None and snap["closed"]:
            return snap
        sleep(interval)
