"""The debug report: the nodes' answers folded into groups of identical stacks, and a diagnosis.

Input: the answers of :func:`rallypoint.agent.debug_service.gather` (one per node: its host and
its workers' stacks, flight records and process states). Each worker's *main* thread (the one
that runs the script) decides its group: workers whose main threads stand on the same frames
fold into one group, printed with their rank list (``ranks 0-6, 12-15``). Smaller groups come
first, with host and pid: the odd ones out are what one looks for.

The diagnosis line reads the flight records: the collective most ranks are in (same group and
sequence number, not completed), and for every other rank, why it is not there: it never
entered it (and where it is instead), or it entered a different one (another op, dtype or shape).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

__all__ = ["diagnose", "flatten", "rank_list", "render", "summary_line"]

#: Frames of rallypoint's own worker start-up, hidden from the stacks shown.
_HIDDEN_FILES = ("worker_main.py", "debug_hooks.py", "<frozen runpy>", "runpy.py")
_LIBRARY_MARKS = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ")


def rank_list(ranks: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` as ``0-2, 5, 7-8``."""
    out: list[str] = []
    ordered = sorted(set(ranks))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ", ".join(out)


def _shown(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in frames if not str(f.get("file", "")).endswith(_HIDDEN_FILES)]


def main_thread(worker: dict[str, Any]) -> dict[str, Any] | None:
    """The thread that runs the script: the one under ``run_main``, else the oldest one listed."""
    threads: list[dict[str, Any]] = worker.get("threads") or []
    for t in threads:
        if any(f.get("func") == "run_main" and str(f.get("file", "")).endswith("worker_main.py") for f in t["frames"]):
            return t
    return threads[-1] if threads else None


def summary_line(frames: list[dict[str, Any]]) -> str:
    """One line for a stack: ``all_reduce <- train.py:88`` (the innermost call, and the script's line)."""
    frames = _shown(frames)
    if not frames:
        return "<no Python frame>"
    inner = frames[0]
    user = next((f for f in frames if not any(m in str(f["file"]) for m in _LIBRARY_MARKS)), None)
    if user is None or user is inner:
        return f"{inner['func']} at {os.path.basename(str(inner['file']))}:{inner['line']}"
    return f"{inner['func']} <- {os.path.basename(str(user['file']))}:{user['line']}"


def flatten(answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every worker of every answer, with its ``host`` and ``node``, by rank."""
    out = []
    for a in answers:
        for w in a.get("workers") or []:
            out.append({**w, "host": a.get("host"), "node": a.get("node")})
    out.sort(key=lambda w: int(w.get("rank", 0)))
    return out


def _where(worker: dict[str, Any]) -> str:
    """What a worker is doing, in a few words (its main thread, or what the kernel says)."""
    t = main_thread(worker)
    state = worker.get("state", "?")
    tasks = worker.get("tasks") or []
    if t is not None:
        main = next((x for x in tasks if x.get("tid") == worker.get("pid")), None)
        kernel = (
            f" [{main['state']} in the kernel: {main['wchan']}]" if main and main.get("wchan") not in ("", "0") else ""
        )
        return summary_line(t["frames"]) + kernel
    wchan = next((x["wchan"] for x in tasks if x.get("wchan") and x["wchan"] != "0"), "")
    if state == "D":
        return f"stuck in the kernel (state D{', ' + wchan if wchan else ''}): no Python stack"
    if not worker.get("state"):
        return "gone (no such process)"
    return f"no Python stack (state {state}{', wchan ' + wchan if wchan else ''})"


def _pending(worker: dict[str, Any]) -> dict[str, Any] | None:
    """The worker's latest collective when it has not completed."""
    flight = worker.get("flight") or []
    if not flight:
        return None
    last = max(flight, key=lambda r: r["start"])
    return last if last["end"] in (None, "async") else None


def _describe(record: dict[str, Any]) -> str:
    shape = "x".join(str(d) for d in record.get("shape") or []) or "-"
    dtype = record.get("dtype") or "?"
    return f"{record['op']} #{record['seq']} (group {record['group']}, {dtype}[{shape}])"


def _who(worker: dict[str, Any]) -> str:
    return f"rank {worker['rank']} (host {worker.get('host')}, pid {worker.get('pid')})"


def diagnose(workers: list[dict[str, Any]]) -> str:
    """One line: where most ranks wait, and which ranks are elsewhere and doing what."""
    if not workers:
        return "diagnosis: no worker answered"
    pending = {w["rank"]: _pending(w) for w in workers}
    keys = Counter((p["group"], p["seq"]) for p in pending.values() if p is not None)
    if not keys:
        groups = _groups(workers)
        if len(groups) <= 1:
            return f"diagnosis: no collective in flight; every rank at {groups[0][0] if groups else '?'}"
        odd = "; ".join(f"{_who(g[1][0])}: {g[0]}" for g in groups[:-1][:4])
        return f"diagnosis: no collective in flight; ranks apart from the others: {odd}"
    (group, seq), _ = keys.most_common(1)[0]
    at = [p for p in pending.values() if p is not None and (p["group"], p["seq"]) == (group, seq)]
    shape = Counter((p["op"], p["dtype"], tuple(p["shape"])) for p in at).most_common(1)[0][0]

    def joined(p: dict[str, Any] | None) -> bool:
        return p is not None and (p["group"], p["seq"], p["op"], p["dtype"], tuple(p["shape"])) == (group, seq, *shape)

    waiting = [w for w in workers if joined(pending[w["rank"]])]
    target = next(p for p in at if (p["op"], p["dtype"], tuple(p["shape"])) == shape)
    ranks = [w["rank"] for w in waiting]
    line = f"diagnosis: {'rank' if len(ranks) == 1 else 'ranks'} {rank_list(ranks)} wait in {_describe(target)}"
    notes = []
    for w in workers:
        if w in waiting:
            continue
        p = pending[w["rank"]]
        mine = [r for r in w.get("flight") or [] if r["group"] == group]
        rec = next((r for r in mine if r["seq"] == seq), None)
        if rec is not None and rec["op"] != target["op"]:
            notes.append(f"{_who(w)} called {_describe(rec)} instead (mismatched op)")
        elif rec is not None and (rec["dtype"], rec["shape"]) != (target["dtype"], target["shape"]):
            notes.append(f"{_who(w)} entered it with {_describe(rec)} (mismatched dtype or shape)")
        elif max((r["seq"] for r in mine), default=-1) < seq:
            notes.append(f"{_who(w)} never entered it: {_where(w)}")
        elif p is not None:
            notes.append(f"{_who(w)} is in {_describe(p)}: {_where(w)}")
        else:
            notes.append(f"{_who(w)} is past it: {_where(w)}")
    if notes:
        line += "; " + "; ".join(notes[:8]) + (f"; and {len(notes) - 8} more" if len(notes) > 8 else "")
    return line


def _groups(workers: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]], list[dict[str, Any]]]]:
    """Workers folded by their main thread's frames: ``(summary, workers, frames)``, smallest group first."""
    folded: dict[Any, list[dict[str, Any]]] = {}
    frames_of: dict[Any, list[dict[str, Any]]] = {}
    for w in workers:
        t = main_thread(w)
        frames = _shown(t["frames"]) if t is not None else []
        key = tuple((f["file"], f["line"], f["func"]) for f in frames) or ("no-stack", _where(w))
        folded.setdefault(key, []).append(w)
        frames_of[key] = frames
    groups = [(_where(ws[0]), ws, frames_of[k]) for k, ws in folded.items()]
    groups.sort(key=lambda g: (len(g[1]), min(w["rank"] for w in g[1])))
    return groups


def render(answers: list[dict[str, Any]], missing: list[str]) -> str:
    """The report as text: odd groups first, each with its stack, then the diagnosis line."""
    workers = flatten(answers)
    lines = []
    groups = _groups(workers)
    for n, (summary, ws, frames) in enumerate(groups):
        ranks = [w["rank"] for w in ws]
        label = "rank" if len(ranks) == 1 else "ranks"
        where = ""
        if len(ws) <= 3 and (n < len(groups) - 1 or len(groups) == 1):
            where = " (" + ", ".join(f"{w.get('host')} pid {w.get('pid')}" for w in ws) + ")"
        lines.append(f"{label} {rank_list(ranks)}: {summary}{where}")
        for f in frames[:30]:
            lines.append(f"    {f['file']}:{f['line']} in {f['func']}")
        others: Counter[str] = Counter()
        for w in ws:
            main = main_thread(w)
            for t in w.get("threads") or []:
                if t is not main:
                    others[summary_line(t["frames"])] += 1
        for text, count in sorted(others.items()):
            lines.append(f"    + {count} other thread(s): {text}")
        stuck = [w for w in ws if w.get("state") == "D"]
        if stuck:
            lines.append(f"    state D (uninterruptible): pids {', '.join(str(w['pid']) for w in stuck)}")
    if missing:
        lines.append(f"no answer from node(s): {', '.join(missing)} (agent gone or busy; retry)")
    lines.append(diagnose(workers))
    return "\n".join(lines)
