"""Rebuild the benchmarks page's tables and charts from the stored results (``docs/bench/*.json``).

    .venv/bin/python tools/bench/page.py            # rewrite the generated parts of the page
    .venv/bin/python tools/bench/page.py --check    # exit 1, naming them, if they are not current

``docs/benchmarks.md`` holds blocks between ``<!-- generated: NAME -->`` and
``<!-- end generated: NAME -->`` lines: ``summary`` (one row per headline measure, with its
target and whether the figures meet it), ``faults`` (the fault scenarios) and ``runs`` (the run
behind every figure: date, command, machine). The charts are SVG files beside the results
(``docs/bench/*.svg``), drawn with :mod:`tools.bench.svg_chart`. Nothing here measures: to
change a figure, run the benchmark and store its figures in the family's JSON file (see
:mod:`tools.bench.results`), then run this script.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `tools.bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench.grpc_server_scale import _chart as grpc_scale_chart
from tools.bench.results import RESULTS_DIR, ResultsError, load_all, parse_figure, parse_ratio, target_met
from tools.bench.svg_chart import BarPanel, Panel, bar_chart, log_log_chart

__all__ = ["CHARTS", "PAGE", "build_charts", "render_page", "stale", "summary_table"]

PAGE = RESULTS_DIR.parent / "benchmarks.md"
#: The families of the summary table, in its order.
ORDER = ("rendezvous", "agent", "warm_workers", "collectives", "rpc", "autograd", "debug", "faults")
Families = dict[str, dict[str, Any]]


def _results(families: Families) -> list[tuple[str, dict[str, Any]]]:
    return [(name, r) for name in ORDER if name in families for r in families[name]["results"]]


def _date(families: Families, family: str, run: str) -> str:
    return str(families[family]["runs"][run]["date"])[:10]


def _status(group: list[dict[str, Any]]) -> str:
    met = [target_met(r) for r in group]
    if met[0] is None:
        return "-"
    missed = met.count(False)
    if not missed:
        return "met"
    if missed == len(met):
        return "**missed**"
    return f"**missed** in {missed} of {len(met)} runs"


def _ratios(group: list[dict[str, Any]]) -> str:
    ratios = sorted({r["ratio"] for r in group if r["ratio"]}, key=parse_ratio)
    if not ratios:
        return "-"
    return ratios[0] if len(ratios) == 1 else f"{ratios[0]} to {ratios[-1]}"


def _side(group: list[dict[str, Any]], side: str) -> str:
    cells = [r[side] if r[side] is not None else r.get("outcome", "-") if side == "rallypoint" else "-" for r in group]
    text = ", ".join(cells)
    base = group[0].get("baseline")
    if side == "torch" and base and text != "-":
        text += f" ({base})"
    return text


def summary_table(families: Families) -> str:
    """The Markdown summary: one row per (id, measure) of the results marked ``summary``.

    Results of several runs of one measure share a row: their figures in run order, the range of
    their ratios, and how many of them miss the target.
    """
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for family, r in _results(families):
        if r.get("summary"):
            groups.setdefault((family, r["id"], r["measure"]), []).append(r)
    lines = [
        "| id | measure | rallypoint | torch, same run | ratio | target | result | measured |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    for (family, ident, measure), group in groups.items():
        target = group[0].get("target")
        dates = sorted({_date(families, family, r["run"]) for r in group})
        lines.append(
            f"| {ident} | {measure} | {_side(group, 'rallypoint')} | {_side(group, 'torch')} | {_ratios(group)} "
            f"| {'<= ' + target['max'] if target else '-'} | {_status(group)} | {', '.join(dates)} |"
        )
    return "\n".join(lines)


def faults_table(families: Families) -> str:
    """The fault scenarios of ``faults.json`` as a Markdown table, as ``tools/fault_table.py`` prints them."""
    cols = (
        ("scenario", "scenario"),
        ("detection", "detection"),
        ("recovery", "recovery (to the first step)"),
        ("steps_lost", "steps lost"),
        ("world_before", "world before"),
        ("world_after", "world after"),
        ("other", "other figures"),
    )
    lines = ["| " + " | ".join(title for _, title in cols) + " |", "|---" * len(cols) + "|"]
    for row in families["faults"]["scenarios"]:
        lines.append("| " + " | ".join(str(row.get(key, "")) for key, _ in cols) + " |")
    return "\n".join(lines)


def runs_table(families: Families) -> str:
    """Every run the page's figures come from: family, date, command, machine and where it was recorded."""
    lines = ["| family | date | command | machine and load | recorded in |", "|---|---|---|---|---|"]
    for name in ORDER:
        if name not in families:
            continue
        for run in families[name]["runs"].values():
            lines.append(
                f"| [{name}](bench/{name}.json) | {run['date']} | `{run['command']}` | {run['machine']} "
                f"| {run['source']} |"
            )
    return "\n".join(lines)


BLOCKS: dict[str, Callable[[Families], str]] = {"summary": summary_table, "faults": faults_table, "runs": runs_table}


def _rendezvous_chart(families: Families) -> str:
    data = families["rendezvous"]
    times: dict[str, list[tuple[float, float]]] = {}
    ratios: dict[str, list[tuple[float, float]]] = {}
    torch: dict[str, dict[float, float]] = {}
    dates: set[str] = set()
    for r in data["results"]:
        if "backend" not in r or "n" not in r:
            continue
        dates.add(_date(families, "rendezvous", r["run"]))
        name = f"rallypoint {r['backend']}"
        times.setdefault(name, []).append((r["n"], parse_figure(r["rallypoint"]).value))
        if r["torch"] is not None:
            base = "torch etcd-v2" if r["backend"] == "etcd" else "torch c10d"
            if r["backend"] != "grpc":  # grpc's torch side repeats the file run's c10d (other dates)
                torch.setdefault(base, {})[r["n"]] = parse_figure(r["torch"]).value
            ratios.setdefault(f"{r['backend']} / {base[6:]}", []).append((r["n"], parse_ratio(r["ratio"])))
    for name, points in torch.items():
        times[name] = sorted(points.items())
    first, last = min(dates), max(dates)
    return log_log_chart(
        [
            Panel("Rendezvous time", "seconds, release to last return", times, legend="bottom-right"),
            Panel("rallypoint / torch, same run", "ratio of medians", ratios),
        ],
        caption=f"tools/bench/rendezvous.py, 2-CPU machine, runs of {first} to {last}; "
        "torch c10d as measured beside the file backend",
    )


def _agent_chart(families: Families) -> str:
    rows: dict[str, dict[str, tuple[str, dict[str, float]]]] = {"time": {}, "restart": {}, "memory": {}}
    labels = {"P1": "P1 first launch", "P1w": "P1w --preload", "P1k": "P1k kept warm", "P3": "P3 restart"}
    labels |= {"P3b": "P3b torch restart", "P8": "P8 agent memory"}
    panel_of = {"P1": "time", "P1w": "time", "P1k": "time", "P3": "restart", "P3b": "restart", "P8": "memory"}
    scale = {"time": 1.0, "restart": 1e3, "memory": 1.0}
    for family in ("agent", "warm_workers"):
        for r in families[family]["results"]:
            panel = panel_of[r["id"]]
            k = scale[panel]
            rows[panel][labels[r["id"]]] = (
                r["id"],
                {
                    "rallypoint": round(parse_figure(r["rallypoint"]).value * k, 4),
                    "torchrun": round(parse_figure(r["torch"]).value * k, 4),
                },
            )
    return bar_chart(
        [
            BarPanel("Whole command", "seconds, spawn to exit", {k: v for k, (_, v) in rows["time"].items()}),
            BarPanel(
                "Restart after a SIGKILL", "ms, kill to new workers", {k: v for k, (_, v) in rows["restart"].items()}
            ),
            BarPanel("Agent memory", "MiB, peak resident", {k: v for k, (_, v) in rows["memory"].items()}),
        ],
        caption="tools/bench/agent.py, 2-CPU machine, quiet; medians",
    )


def _rpc_chart(families: Families) -> str:
    data = families["rpc"]
    latest = {"tcp": "rpc-tcp-2", "shm": "rpc-shm-2"}
    series: dict[str, list[tuple[float, float]]] = {}
    for r in data["results"]:
        if "payload_bytes" not in r or r["run"] != latest[r["path"]]:
            continue
        link = "TCP" if r["path"] == "tcp" else "same host"
        series.setdefault(f"rallypoint, {link}", []).append(
            (r["payload_bytes"], parse_figure(r["rallypoint"]).value * 1e3)
        )
        series.setdefault(f"torch, {r['baseline']}", []).append(
            (r["payload_bytes"], parse_figure(r["torch"]).value * 1e3)
        )
    run = data["runs"]["rpc-tcp-2"]
    return log_log_chart(
        [Panel("rpc_sync echo latency (median)", "ms per call", series, x_label="payload, bytes")],
        caption=f"tools/bench/rpc.py, {run['date'][:10]}, quiet",
    )


def _faults_chart(families: Families) -> str:
    rows: dict[str, dict[str, float]] = {}
    for row in families["faults"]["scenarios"]:
        bars = {}
        for key in ("detection", "recovery"):
            if row[key] not in ("-", "0"):
                bars[key] = parse_figure(row[key]).value
        if bars:
            rows[row.get("label", row["scenario"][:24])] = bars
    run = next(iter(families["faults"]["runs"].values()))
    return bar_chart(
        [BarPanel("Faults across hosts", "seconds after the fault", rows)],
        caption=f"tools/fault_table.py --run, {run['date']}",
    )


def _grpc_scale_chart(families: Families) -> str:
    data = families["grpc_server_scale"]
    return grpc_scale_chart(data["rounds"], data["torch_c10d"], data["caption"])


#: Chart file (under docs/bench/) -> its builder.
CHARTS: dict[str, Callable[[Families], str]] = {
    "rendezvous.svg": _rendezvous_chart,
    "agent.svg": _agent_chart,
    "rpc.svg": _rpc_chart,
    "faults.svg": _faults_chart,
    "grpc_server_scale.svg": _grpc_scale_chart,
}


def build_charts(families: Families) -> dict[str, str]:
    """Chart file name -> its SVG text."""
    return {name: build(families) for name, build in CHARTS.items()}


def render_page(text: str, families: Families) -> str:
    """``text`` with every generated block rebuilt from ``families``.

    Raises:
        ValueError: a block the page must hold is missing, or unknown, or not closed.
    """
    found = set(re.findall(r"^<!-- generated: (\w+) -->$", text, re.M))
    unknown = found - set(BLOCKS)
    if unknown:
        raise ValueError(f"{PAGE.name}: unknown generated block(s) {sorted(unknown)} (known: {sorted(BLOCKS)})")
    missing = set(BLOCKS) - found
    if missing:
        raise ValueError(f"{PAGE.name}: no '<!-- generated: NAME -->' block for {sorted(missing)}")
    for name, build in BLOCKS.items():
        pattern = re.compile(rf"^(<!-- generated: {name} -->\n).*?^(<!-- end generated: {name} -->)$", re.M | re.S)
        match = pattern.search(text)
        if match is None:
            raise ValueError(f"{PAGE.name}: block {name!r} has no '<!-- end generated: {name} -->' line")
        text = text[: match.start()] + match.group(1) + build(families) + "\n" + match.group(2) + text[match.end() :]
    return text


def stale(page: Path = PAGE, directory: Path = RESULTS_DIR, *, write: bool = False) -> list[str]:
    """The generated files that differ from what the stored results give (rewritten if ``write``)."""
    families = load_all(directory)
    wanted = {page: render_page(page.read_text(), families)}
    wanted |= {directory / name: svg for name, svg in build_charts(families).items()}
    out = []
    for path, content in wanted.items():
        if not path.exists() or path.read_text() != content:
            out.append(str(path))
            if write:
                path.write_text(content)
    return out


def main(argv: list[str] | None = None) -> int:
    """Rewrite (or with ``--check`` only compare) the page's generated parts and the charts."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if a generated file is not current"
    )
    parser.add_argument("--page", type=Path, default=PAGE, help=f"the page (default {PAGE})")
    parser.add_argument(
        "--results", type=Path, default=RESULTS_DIR, help=f"the results and charts (default {RESULTS_DIR})"
    )
    args = parser.parse_args(argv)
    try:
        changed = stale(args.page, args.results, write=not args.check)
    except (OSError, ResultsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in changed:
        print(f"{'not current' if args.check else 'rewrote'}: {path}")
    if args.check and changed:
        print("run: .venv/bin/python tools/bench/page.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
