#!/usr/bin/env python3
"""The fault table of docs/benchmarks.md, from ``integration-tests/results.json``.

    sudo .venv/bin/python tools/fault_table.py --run     # run the fault tests (namespace hosts), then print
    .venv/bin/python tools/fault_table.py                # print the table of the last run

``--run`` deletes the previous results, runs the multi-host fault tests with ``pytest -n 2``
(they need root for the namespace hosts), prints how long the run took, then the table in
Markdown. Add ``--preload torch`` to run the jobs with warm workers (``rallypoint run --preload``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "integration-tests" / "results.json"
TESTS = [
    "integration-tests/test_ddp_multihost.py",
    "integration-tests/test_faults_multihost.py",
    "integration-tests/test_spares.py",
    "integration-tests/test_rdzv_outage_multihost.py",
    "integration-tests/test_partitions_multihost.py",
    "integration-tests/test_torchrun_multihost.py",
]
COLUMNS = (
    ("detection_s", "detection"),
    ("recovery_s", "recovery (to the first step)"),
    ("steps_lost", "steps lost"),
    ("world_before", "world before"),
    ("world_after", "world after"),
)


def _cell(value: object, key: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f} s" if key.endswith("_s") else f"{value:.2g}"
    return str(value)


def table(results: dict[str, dict[str, object]]) -> str:
    """The Markdown table: one row per scenario, the common figures as columns, the rest in notes."""
    lines = ["| scenario | " + " | ".join(title for _, title in COLUMNS) + " | other figures |"]
    lines.append("|---" * (len(COLUMNS) + 2) + "|")
    for scenario in sorted(results):
        row = results[scenario]
        known = {key for key, _ in COLUMNS} | {"measured_at"}
        others = ", ".join(f"{k} {_cell(v, k)}" for k, v in sorted(row.items()) if k not in known)
        cells = [_cell(row.get(key), key) for key, _ in COLUMNS]
        lines.append(f"| {scenario} | " + " | ".join(cells) + f" | {others} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="store_true", help="run the fault tests first (needs root)")
    parser.add_argument("--preload", metavar="MODULES", help="run the jobs with warm workers (e.g. torch)")
    args = parser.parse_args(argv)
    if args.run:
        RESULTS.unlink(missing_ok=True)
        env = dict(os.environ)
        if args.preload:
            env["RP_FAULTS_PRELOAD"] = args.preload
        argv_ = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2", *TESTS]
        started = time.monotonic()
        proc = subprocess.run(argv_, cwd=ROOT, env=env, check=False)
        print(f"fault tests: exit {proc.returncode} in {time.monotonic() - started:.0f} s", file=sys.stderr)
        if proc.returncode != 0:
            return proc.returncode
    if not RESULTS.exists():
        print(f"error: {RESULTS} does not exist; run with --run (as root) first", file=sys.stderr)
        return 2
    print(table(json.loads(RESULTS.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
