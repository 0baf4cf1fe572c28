"""The debug report: the nodes' answers folded into groups of identical stacks, and a diagnosis.

Input: the answers of :func:`rallypoint.agent.debug_service.gather` (one per node: its host and
its workers' stacks, flight records and process states). Each worker's *main* thread (the one
that runs the script) decides its group: workers whose main threads stand on the same frames
fold into one group, printed with their rank list (``ranks 0-6, 12-15``). Smaller groups come
first, with host and pid: the odd ones out are what one looks for.

The diagnosis line reads the flight records: the collective most ranks are in (same group and
sequence number, not completed), and for every other rank, why it is not there: it never
entered it (and where it is instead), or it entered a different one (another op, dtype or shape).
Then, for every rank waiting in a point-to-point call (``recv``, ``send``, ``irecv``, ``isend``,
``batch_isend_irecv``), what its peer did with the matching call (the peer's call of the other
direction, to this rank, with the same sequence number): never made it (and where the peer is
instead), made it with another tag or size, or is in it too.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from rallypoint.agent.debug_flight import P2P_OPS, SEND_OPS

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
    flight = [r for r in worker.get("flight") or [] if r["op"] not in P2P_OPS]
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


def _p2p_waits(worker: dict[str, Any]) -> list[dict[str, Any]]:
    """The worker's point-to-point calls in flight, oldest first."""
    flight = worker.get("flight") or []
    return sorted((r for r in flight if r["op"] in P2P_OPS and r["end"] is None), key=lambda r: r["start"])


def _describe_p2p(record: dict[str, Any]) -> str:
    """``recv #2 from rank 1 (group default, tag 0, float32[16], 64 bytes)``."""
    peer = record.get("peer")
    towards = "to" if record["op"] in SEND_OPS else "from"
    who = "any rank" if peer is None or peer < 0 else f"rank {peer}"
    shape = "x".join(str(d) for d in record.get("shape") or []) or "-"
    size = "" if record.get("bytes") is None else f", {record['bytes']} bytes"
    what = f"group {record['group']}, tag {record.get('tag')}, {record.get('dtype') or '?'}[{shape}]{size}"
    return f"{record['op']} #{record['seq']} {towards} {who} ({what})"


def _p2p_note(worker: dict[str, Any], record: dict[str, Any], by_rank: dict[int, dict[str, Any]]) -> str:
    """One rank's wait in a point-to-point call, and what its peer did with the other side of it."""
    head = f"rank {worker['rank']} waits in {_describe_p2p(record)}"
    sending = record["op"] in SEND_OPS
    peer = record.get("peer")
    if peer is None or peer < 0:
        senders = [
            w["rank"]
            for w in by_rank.values()
            if any(r["op"] in SEND_OPS and r.get("peer") == worker["rank"] for r in _p2p_waits(w))
        ]
        return head + (f": rank(s) {rank_list(senders)} send to it" if senders else ": no rank sends to it")
    other = by_rank.get(peer)
    if other is None:
        return f"{head}: rank {peer} did not answer"
    theirs = [
        r
        for r in other.get("flight") or []
        if r["op"] in P2P_OPS
        and (r["op"] in SEND_OPS) != sending
        and r["group"] == record["group"]
        and r.get("peer") == worker["rank"]
    ]
    match = next((r for r in theirs if r["seq"] == record["seq"]), None)
    done = "received" if sending else "sent"
    if match is None:
        if max((r["seq"] for r in theirs), default=-1) < record["seq"]:
            return f"{head}: {_who(other)} never {done} it: {_where(other)}"
        return f"{head}: {_who(other)} is past it (its record is out of the ring): {_where(other)}"
    if match.get("tag") != record.get("tag"):
        return f"{head}: {_who(other)} {done} it with tag {match.get('tag')} instead (mismatched tag)"
    if None not in (match.get("bytes"), record.get("bytes")) and match["bytes"] != record["bytes"]:
        return f"{head}: {_who(other)} {done} it as {_describe_p2p(match)} (mismatched size)"
    if match["end"] is None:
        return f"{head}: {_who(other)} is in it too: {_where(other)}"
    return f"{head}: {_who(other)} {done} it"


def _p2p_notes(workers: list[dict[str, Any]]) -> list[str]:
    """A note for every rank waiting in a point-to-point call: first those whose peer is not itself waiting in one."""
    by_rank = {w["rank"]: w for w in workers}
    waits = {w["rank"]: _p2p_waits(w) for w in workers}
    notes = []
    for w in workers:
        if waits[w["rank"]]:
            record = waits[w["rank"]][0]
            chained = bool(waits.get(record.get("peer", -1)))  # its peer waits in one too: not the root cause
            notes.append((chained, w["rank"], _p2p_note(w, record, by_rank)))
    return [text for _, _, text in sorted(notes)]


def _joined(notes: list[str]) -> str:
    return "; ".join(notes[:8]) + (f"; and {len(notes) - 8} more" if len(notes) > 8 else "")


def diagnose(workers: list[dict[str, Any]]) -> str:
    """One line: where most ranks wait, and which ranks are elsewhere and doing what."""
    if not workers:
        return "diagnosis: no worker answered"
    pending = {w["rank"]: _pending(w) for w in workers}
    keys = Counter((p["group"], p["seq"]) for p in pending.values() if p is not None)
    p2p = _p2p_notes(workers)
    if not keys and p2p:
        return f"diagnosis: {_joined(p2p)}"
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
    who = f"rank {rank_list(ranks)} waits" if len(ranks) == 1 else f"ranks {rank_list(ranks)} wait"
    line = f"diagnosis: {who} in {_describe(target)}"
    notes = []
    for w in workers:
        if w in waiting:
            continue
        p = pending[w["rank"]]
        mine = [r for r in w.get("flight") or [] if r["group"] == group and r["op"] not in P2P_OPS]
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
    notes += p2p
    if notes:
        line += "; " + _joined(notes)
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
