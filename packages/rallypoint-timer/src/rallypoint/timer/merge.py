"""Merging per-worker event logs into one global timeline; Chrome trace export; step reports.

Logs are found under a run directory as ``attempt_N/timeline/rank_R.jsonl`` (what the agent
writes), or given directly. Each rank's timestamps are moved onto rank 0's clock with the
latest ``clock`` estimate in its log (see :mod:`rallypoint.timer.clock`). An event that was
still open when its log ends (the worker was killed) is kept, marked ``unfinished``, ending at
the last timestamp of that log.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "RankLog",
    "Span",
    "StepReport",
    "Timeline",
    "find_logs",
    "format_report",
    "load_log",
    "merge_logs",
    "step_report",
]

_RANK_RE = re.compile(r"rank_(\d+)\.jsonl$")
_ATTEMPT_RE = re.compile(r"attempt_(\d+)$")


@dataclass(frozen=True)
class Span:
    """One recorded event on the global clock.

    Attributes:
        rank: the worker's rank.
        attempt: the restart attempt it ran in (0 when unknown).
        name: the event name.
        start_ns: start on rank 0's clock (ns since the epoch).
        end_ns: end on rank 0's clock.
        tid: the recording thread (``-1`` for CUDA spans).
        depth: nesting depth on that thread.
        args: the event's arguments.
        unfinished: the worker stopped (or the log ended) before the event ended.
        kind: ``"cpu"`` or ``"cuda"``.
    """

    rank: int
    attempt: int
    name: str
    start_ns: int
    end_ns: int
    tid: int
    depth: int
    args: dict[str, Any] = field(default_factory=dict)
    unfinished: bool = False
    kind: str = "cpu"

    @property
    def duration_ns(self) -> int:
        """End minus start."""
        return self.end_ns - self.start_ns


@dataclass
class RankLog:
    """One worker's log, parsed.

    Attributes:
        path: the file (``None`` for an in-memory recorder).
        rank, attempt: from the header (or the path).
        offset_ns, uncertainty_ns: the clock estimate used (0 when the log has none).
        spans: the events, on the global clock.
        bad_lines: lines that could not be parsed (a torn last line after a crash).
    """

    path: Path | None
    rank: int
    attempt: int
    offset_ns: int = 0
    uncertainty_ns: int | None = None
    spans: list[Span] = field(default_factory=list)
    bad_lines: int = 0
    host: str = ""


def _parse_records(lines: Iterable[bytes | str]) -> tuple[list[dict[str, Any]], int]:
    records, bad = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(rec, dict):
            records.append(rec)
        else:
            bad += 1
    return records, bad


def load_records(
    records: Sequence[dict[str, Any]], *, path: Path | None = None, rank: int | None = None, attempt: int | None = None
) -> RankLog:
    """Build a :class:`RankLog` from parsed log records (``B``/``E`` paired per thread)."""
    meta = next((r for r in records if r.get("t") == "meta"), {})
    rank = int(meta.get("rank", 0)) if rank is None else rank
    if attempt is None:
        attempt = int(meta.get("attempt") or 0)
    clocks = [r for r in records if r.get("t") == "clock"]
    out = RankLog(path=path, rank=rank, attempt=attempt, host=str(meta.get("host", "")))
    if clocks:
        out.offset_ns = int(clocks[-1]["offset_ns"])
        out.uncertainty_ns = int(clocks[-1]["uncertainty_ns"])
    off = out.offset_ns
    stacks: dict[int, list[dict[str, Any]]] = {}
    last_ts = 0
    for rec in records:
        kind = rec.get("t")
        ts = rec.get("ts")
        if isinstance(ts, int):
            last_ts = max(last_ts, ts)
        if kind == "B":
            stacks.setdefault(int(rec["tid"]), []).append(rec)
        elif kind == "E":
            stack = stacks.get(int(rec["tid"]), [])
            for i in range(len(stack) - 1, -1, -1):
                if stack[i]["name"] == rec["name"]:
                    begin = stack.pop(i)
                    out.spans.append(
                        Span(
                            rank,
                            attempt,
                            begin["name"],
                            begin["ts"] + off,
                            rec["ts"] + off,
                            int(begin["tid"]),
                            int(begin.get("d", i)),
                            dict(begin.get("args") or {}),
                        )
                    )
                    break
        elif kind == "cuda":
            out.spans.append(
                Span(
                    rank,
                    attempt,
                    rec["name"],
                    rec["ts"] + off,
                    rec["ts"] + off + int(rec["dur_ns"]),
                    -1,
                    0,
                    {},
                    False,
                    "cuda",
                )
            )
    for stack in stacks.values():
        for begin in stack:
            out.spans.append(
                Span(
                    rank,
                    attempt,
                    begin["name"],
                    begin["ts"] + off,
                    max(last_ts, begin["ts"]) + off,
                    int(begin["tid"]),
                    int(begin.get("d", 0)),
                    dict(begin.get("args") or {}),
                    unfinished=True,
                )
            )
    out.spans.sort(key=lambda s: (s.start_ns, s.depth))
    return out


def load_log(path: str | Path) -> RankLog:
    """Parse one ``rank_R.jsonl`` (rank and attempt from its header, else from its path)."""
    path = Path(path)
    records, bad = _parse_records(path.read_bytes().splitlines())
    rank = attempt = None
    if not any(r.get("t") == "meta" for r in records):
        m = _RANK_RE.search(path.name)
        rank = int(m.group(1)) if m else 0
    a = _ATTEMPT_RE.search(path.parent.parent.name)
    if a and not any(r.get("t") == "meta" and r.get("attempt") is not None for r in records):
        attempt = int(a.group(1))
    log = load_records(records, path=path, rank=rank, attempt=attempt)
    log.bad_lines = bad
    return log


def find_logs(paths: Iterable[str | Path]) -> list[Path]:
    """Every ``rank_*.jsonl`` under the given run directories (or the files themselves)."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            found.append(p)
        elif p.is_dir():
            found.extend(sorted(q for q in p.rglob("rank_*.jsonl") if q.is_file()))
    return found


@dataclass
class Timeline:
    """The merged global timeline of a run.

    Attributes:
        logs: one per worker log.
        spans: every span of every rank, ordered by start on rank 0's clock.
    """

    logs: list[RankLog]
    spans: list[Span] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.spans:
            self.spans = sorted(
                (s for log in self.logs for s in log.spans), key=lambda s: (s.start_ns, s.rank, s.depth)
            )

    @property
    def ranks(self) -> list[int]:
        """The ranks present."""
        return sorted({log.rank for log in self.logs})

    def to_chrome_trace(self) -> dict[str, Any]:
        """The timeline as Chrome trace JSON (load it in Perfetto or chrome://tracing).

        One process per rank (``pid`` = rank), one track per recording thread plus ``cuda``;
        timestamps in microseconds from the earliest event.
        """
        origin = min((s.start_ns for s in self.spans), default=0)
        events: list[dict[str, Any]] = []
        tids: dict[tuple[int, int], int] = {}
        for log in self.logs:
            label = f"rank {log.rank}" + (f" ({log.host})" if log.host else "")
            events.append({"ph": "M", "name": "process_name", "pid": log.rank, "tid": 0, "args": {"name": label}})
            events.append(
                {"ph": "M", "name": "process_sort_index", "pid": log.rank, "tid": 0, "args": {"sort_index": log.rank}}
            )
        for s in self.spans:
            key = (s.rank, s.tid)
            if key not in tids:
                tids[key] = 0 if s.tid == -1 else len([k for k in tids if k[0] == s.rank]) + 1
                name = "cuda" if s.tid == -1 else f"thread {tids[key]}"
                events.append(
                    {"ph": "M", "name": "thread_name", "pid": s.rank, "tid": tids[key], "args": {"name": name}}
                )
            args = dict(s.args)
            if s.attempt:
                args["attempt"] = s.attempt
            if s.unfinished:
                args["unfinished"] = True
            events.append(
                {
                    "ph": "X",
                    "name": s.name,
                    "cat": s.kind,
                    "pid": s.rank,
                    "tid": tids[key],
                    "ts": (s.start_ns - origin) / 1000.0,
                    "dur": s.duration_ns / 1000.0,
                    "args": args,
                }
            )
        offsets = {
            str(log.rank): {"offset_ns": log.offset_ns, "uncertainty_ns": log.uncertainty_ns, "attempt": log.attempt}
            for log in self.logs
        }
        return {
            "traceEvents": events,
            "displayTimeUnit": "ms",
            "otherData": {"origin_ns": origin, "clock_offsets": offsets},
        }

    def write_chrome_trace(self, path: str | Path) -> Path:
        """Write :meth:`to_chrome_trace` to ``path``."""
        path = Path(path)
        path.write_text(json.dumps(self.to_chrome_trace()))
        return path


def merge_logs(paths: Iterable[str | Path]) -> Timeline:
    """Merge the logs found under ``paths`` (run directories or files)."""
    return Timeline([load_log(p) for p in find_logs(paths)])


# ------------------------------------------------------------------------------------------------
# Step report


@dataclass(frozen=True)
class StepReport:
    """One step across ranks.

    Attributes:
        attempt: the attempt.
        step: the step number (the event's ``step`` argument, else its occurrence index).
        durations_ns: per rank.
        slowest_rank: the rank with the longest step.
        stragglers: ranks slower than the median by more than the threshold.
        gap_ns: per rank, idle time between the end of its previous step and the start of this one.
        skew_ns: the spread of the ranks' end times (on rank 0's clock).
    """

    attempt: int
    step: int
    durations_ns: dict[int, int]
    slowest_rank: int
    stragglers: tuple[int, ...]
    gap_ns: dict[int, int]
    skew_ns: int

    @property
    def median_ns(self) -> float:
        """Median step duration over ranks."""
        return float(statistics.median(self.durations_ns.values()))


def step_report(timeline: Timeline, *, step_event: str = "step", threshold: float = 0.2) -> list[StepReport]:
    """Per step: slowest rank, stragglers (duration above ``(1 + threshold) x`` median), gaps.

    A step is an event named ``step_event`` (outermost of that name); its number is its
    ``step`` argument, else the order of occurrence on its rank.
    """
    per: dict[tuple[int, int], dict[int, Span]] = {}
    prev_end: dict[tuple[int, int], int] = {}
    gaps: dict[tuple[int, int], dict[int, int]] = {}
    counters: dict[tuple[int, int], int] = {}
    for s in sorted(timeline.spans, key=lambda s: s.start_ns):
        if s.name != step_event or s.kind != "cpu":
            continue
        rk = (s.attempt, s.rank)
        n = counters.get(rk, 0)
        counters[rk] = n + 1
        raw = s.args.get("step", n)
        step = int(raw) if isinstance(raw, int | float | str) and str(raw).lstrip("-").isdigit() else n
        per.setdefault((s.attempt, step), {})[s.rank] = s
        if rk in prev_end:
            gaps.setdefault((s.attempt, step), {})[s.rank] = max(0, s.start_ns - prev_end[rk])
        prev_end[rk] = s.end_ns
    reports = []
    for (attempt, step), spans in sorted(per.items()):
        durations = {r: sp.duration_ns for r, sp in sorted(spans.items())}
        median = statistics.median(durations.values())
        slowest = max(durations, key=lambda r: (durations[r], -r))
        stragglers = tuple(r for r, d in durations.items() if len(durations) > 1 and d > median * (1 + threshold))
        ends = [sp.end_ns for sp in spans.values()]
        reports.append(
            StepReport(
                attempt, step, durations, slowest, stragglers, gaps.get((attempt, step), {}), max(ends) - min(ends)
            )
        )
    return reports


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.2f}"


def format_report(timeline: Timeline, reports: Sequence[StepReport], *, step_event: str = "step") -> str:
    """A text table of :func:`step_report`, with the clock offsets and a summary."""
    lines = [f"ranks: {', '.join(map(str, timeline.ranks)) or '(none)'}; {len(timeline.spans)} events"]
    for log in timeline.logs:
        unc = "no estimate" if log.uncertainty_ns is None else f"{_ms(log.offset_ns)} ms ± {_ms(log.uncertainty_ns)} ms"
        extra = f", {log.bad_lines} unreadable line(s)" if log.bad_lines else ""
        unfinished = [s.name for s in log.spans if s.unfinished]
        open_ = f", unfinished: {', '.join(unfinished)}" if unfinished else ""
        lines.append(f"  rank {log.rank} attempt {log.attempt}: clock offset {unc}{extra}{open_}")
    if not reports:
        lines.append(f"no '{step_event}' events (use --step-event NAME)")
        return "\n".join(lines)
    header = (
        f"{'attempt':>7} {'step':>6} {'ranks':>5} {'median ms':>10} {'slowest':>8} {'max ms':>9} "
        f"{'skew ms':>8} {'max gap ms':>10}  stragglers"
    )
    lines += [header, "-" * len(header)]
    slow_count: dict[int, int] = {}
    for r in reports:
        slow_count[r.slowest_rank] = slow_count.get(r.slowest_rank, 0) + 1
        gap = max(r.gap_ns.items(), key=lambda kv: kv[1]) if r.gap_ns else None
        gap_s = f"{_ms(gap[1])} (r{gap[0]})" if gap else "-"
        lines.append(
            f"{r.attempt:>7} {r.step:>6} {len(r.durations_ns):>5} {_ms(r.median_ns):>10} {r.slowest_rank:>8} "
            f"{_ms(r.durations_ns[r.slowest_rank]):>9} {_ms(r.skew_ns):>8} {gap_s:>10}  "
            f"{', '.join(map(str, r.stragglers)) or '-'}"
        )
    worst = max(slow_count, key=lambda k: (slow_count[k], -k))
    lines.append(f"slowest most often: rank {worst} ({slow_count[worst]} of {len(reports)} steps)")
    return "\n".join(lines)
