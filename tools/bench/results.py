"""Stored benchmark results: the JSON files under ``docs/bench/`` that the benchmarks page quotes.

One file per benchmark family (``rendezvous.json``, ``agent.json``...). Each holds the runs its
figures come from and the figures themselves, transcribed as the run printed them (so nothing is
rounded twice)::

    {
      "family": "agent",
      "title": "what the family measures",
      "script": "tools/bench/agent.py",
      "runs": {"RUN-ID": {"date": "...", "command": "...", "machine": "...", "source": "..."}},
      "results": [
        {"id": "P1", "measure": "...", "run": "RUN-ID",
         "rallypoint": "3.012 s", "torch": "4.801 s", "ratio": "0.627x",
         "target": {"max": "0.45x", "source": "TARGETS.md P1"}, "summary": true}
      ]
    }

A figure is ``"<number> <unit>"`` (units ``us``, ``ms``, ``s``, ``MiB``) or ``null`` where a side
has none (rallypoint alone, or a run that did not complete: then ``outcome`` says what happened).
A ratio is ``"<number>x"``, rallypoint's median over torch's. A target's ``max`` is a ratio
(``"0.45x"``: the ratio must not exceed it) or a figure (``"2 s"``: rallypoint's figure must not).
``summary: true`` puts the result in the page's summary table. Any other key is kept for the
charts (``n``, ``backend``, ``path``, ``payload_bytes``...) or shown as a note (``note``).

``grpc_server_scale.json`` is written by ``tools/bench/grpc_server_scale.py --json`` in a shape of
its own (``title``, ``caption``, ``rounds``, ``torch_c10d``) and is checked for those keys.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "RESULTS_DIR",
    "Figure",
    "ResultsError",
    "load_family",
    "load_all",
    "parse_figure",
    "parse_ratio",
    "target_met",
]

RESULTS_DIR = Path(__file__).resolve().parents[2] / "docs" / "bench"

#: Files in RESULTS_DIR written by a script in a shape of their own, and the keys they need.
SCRIPT_FILES: dict[str, tuple[str, ...]] = {"grpc_server_scale.json": ("title", "caption", "rounds", "torch_c10d")}

_FAMILY_KEYS = ("family", "title", "script", "runs", "results")
_RUN_KEYS = ("date", "command", "machine", "source")
_RESULT_KEYS = ("id", "measure", "run", "rallypoint", "torch", "ratio")
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "MiB": 1.0}
_FIGURE = re.compile(r"^(\d+(?:\.\d+)?) (us|ms|s|MiB)$")
_RATIO = re.compile(r"^(\d+(?:\.\d+)?)x$")
#: A quoted ratio has 3 significant digits and a figure 3 or 4: the ratio of two quoted figures
#: may differ from the quoted ratio by this much (relative) and still be the same run's.
RATIO_TOLERANCE = 0.012


class ResultsError(ValueError):
    """A stored results file is malformed; the message names the file and the key."""


@dataclass(frozen=True)
class Figure:
    """A parsed figure: ``value`` in the unit's base (seconds for times, MiB for memory)."""

    text: str
    value: float
    kind: str  # "time" or "memory"


def parse_figure(text: str) -> Figure:
    """``"3.536 ms"`` -> Figure(value=0.003536, kind="time").

    Raises:
        ValueError: not ``<number> <unit>`` with a known unit.
    """
    m = _FIGURE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a figure '<number> <unit>' with unit us, ms, s or MiB")
    number, unit = m.groups()
    return Figure(text, float(number) * _UNITS[unit], "memory" if unit == "MiB" else "time")


def parse_ratio(text: str) -> float:
    """``"0.627x"`` -> 0.627.

    Raises:
        ValueError: not ``<number>x``.
    """
    m = _RATIO.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a ratio '<number>x'")
    return float(m.group(1))


def target_met(result: dict[str, Any]) -> bool | None:
    """Whether ``result`` meets its target: None without a target, False where no figure was taken."""
    target = result.get("target")
    if not target:
        return None
    limit = target["max"]
    if limit.endswith("x"):
        return result["ratio"] is not None and parse_ratio(result["ratio"]) <= parse_ratio(limit)
    if result["rallypoint"] is None:
        return False
    return parse_figure(result["rallypoint"]).value <= parse_figure(limit).value


def _need(data: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    missing = [k for k in keys if k not in data]
    if missing:
        raise ResultsError(f"{where}: missing key(s) {', '.join(missing)}")


def _check_result(r: Any, runs: dict[str, Any], where: str) -> None:
    if not isinstance(r, dict):
        raise ResultsError(f"{where}: a result must be an object, got {type(r).__name__}")
    _need(r, _RESULT_KEYS, where)
    if r["run"] not in runs:
        raise ResultsError(f"{where}: run {r['run']!r} is not one of the file's runs ({', '.join(runs)})")
    figures: dict[str, Figure] = {}
    for side in ("rallypoint", "torch"):
        if r[side] is None:
            continue
        try:
            figures[side] = parse_figure(r[side])
        except ValueError as exc:
            raise ResultsError(f"{where}, key {side!r}: {exc}") from None
    if r["rallypoint"] is None and not r.get("outcome"):
        raise ResultsError(f"{where}: 'rallypoint' is null, so 'outcome' must say what happened")
    if r["ratio"] is not None:
        try:
            ratio = parse_ratio(r["ratio"])
        except ValueError as exc:
            raise ResultsError(f"{where}, key 'ratio': {exc}") from None
        if len(figures) != 2:
            raise ResultsError(f"{where}: a ratio needs both sides' figures")
        a, b = figures["rallypoint"], figures["torch"]
        if a.kind != b.kind:
            raise ResultsError(f"{where}: the sides' figures are not of one kind ({a.text}, {b.text})")
        computed = a.value / b.value
        if abs(computed - ratio) > RATIO_TOLERANCE * ratio:
            raise ResultsError(
                f"{where}: ratio {r['ratio']} does not match {a.text} / {b.text} = {computed:.4g}x "
                "(a transcription error?)"
            )
    target = r.get("target")
    if target is not None:
        if not isinstance(target, dict) or "max" not in target or "source" not in target:
            raise ResultsError(f"{where}, key 'target': wants {{'max': ..., 'source': ...}}, got {target!r}")
        limit = target["max"]
        try:
            kind = "ratio" if limit.endswith("x") else parse_figure(limit).kind
            if kind == "ratio":
                parse_ratio(limit)
        except ValueError as exc:
            raise ResultsError(f"{where}, key 'target.max': {exc}") from None
        if kind == "ratio" and r["ratio"] is None and r["rallypoint"] is not None:
            raise ResultsError(f"{where}: a ratio target ({limit}) needs a ratio")
        if kind != "ratio" and "rallypoint" in figures and figures["rallypoint"].kind != kind:
            raise ResultsError(f"{where}: target {limit} and figure {r['rallypoint']} differ in kind")


def validate_family(data: Any, name: str) -> dict[str, Any]:
    """Check one family's data (see the module docstring); returns it.

    Raises:
        ResultsError: naming ``name``, the key and what is wrong.
    """
    if not isinstance(data, dict):
        raise ResultsError(f"{name}: the top level must be an object")
    _need(data, _FAMILY_KEYS, name)
    runs = data["runs"]
    if not isinstance(runs, dict) or not runs:
        raise ResultsError(f"{name}, key 'runs': wants an object of run id -> run, at least one")
    for run_id, run in runs.items():
        if not isinstance(run, dict):
            raise ResultsError(f"{name}, run {run_id!r}: must be an object")
        _need(run, _RUN_KEYS, f"{name}, run {run_id!r}")
    if not isinstance(data["results"], list) or not data["results"]:
        raise ResultsError(f"{name}, key 'results': wants a list of results, at least one")
    for i, r in enumerate(data["results"]):
        _check_result(r, runs, f"{name}, results[{i}] ({r.get('measure', '?') if isinstance(r, dict) else '?'})")
    scenarios = data.get("scenarios", [])
    if not isinstance(scenarios, list):
        raise ResultsError(f"{name}, key 'scenarios': wants a list")
    rows = {}
    for i, row in enumerate(scenarios):
        if not isinstance(row, dict):
            raise ResultsError(f"{name}, scenarios[{i}]: must be an object")
        _need(row, ("scenario", "run"), f"{name}, scenarios[{i}]")
        if row["run"] not in runs:
            raise ResultsError(f"{name}, scenarios[{i}]: run {row['run']!r} is not one of the file's runs")
        rows[row["scenario"]] = row
    for i, r in enumerate(data["results"]):
        if "scenario" not in r:
            continue
        where = f"{name}, results[{i}] ({r['measure']})"
        if r["scenario"] not in rows:
            raise ResultsError(f"{where}: scenario {r['scenario']!r} is not in 'scenarios'")
        cells = " | ".join(str(v) for k, v in rows[r["scenario"]].items() if k != "run")
        if r["rallypoint"] is not None and r["rallypoint"] not in cells:
            raise ResultsError(f"{where}: {r['rallypoint']} is not a figure of scenario {r['scenario']!r}")
    used = {r["run"] for r in data["results"]} | {s["run"] for s in scenarios}
    unused = sorted(set(runs) - used)
    if unused:
        raise ResultsError(f"{name}, key 'runs': run(s) {', '.join(unused)} quoted by no result")
    return data


def load_family(path: Path) -> dict[str, Any]:
    """Read and check one results file.

    Raises:
        ResultsError: the file is not JSON, or not a valid family (or script) file.
    """
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ResultsError(f"{path}: cannot read it as JSON: {exc}") from None
    if path.name in SCRIPT_FILES:
        if not isinstance(data, dict):
            raise ResultsError(f"{path}: the top level must be an object")
        _need(data, SCRIPT_FILES[path.name], str(path))
        return data
    return validate_family(data, str(path))


def load_all(directory: Path = RESULTS_DIR) -> dict[str, dict[str, Any]]:
    """Every ``*.json`` of ``directory``, checked, by file stem.

    Raises:
        ResultsError: a file is malformed, or a family's ``family`` key differs from its file name.
    """
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.glob("*.json")):
        data = load_family(path)
        if path.name not in SCRIPT_FILES and data["family"] != path.stem:
            raise ResultsError(f"{path}: key 'family' is {data['family']!r}, the file is named {path.stem!r}")
        out[path.stem] = data
    return out
