"""Every benchmark script: --help runs nothing, bad arguments exit 2, and a smoke run of both
sides prints its tables and ends with the rallypoint/torch ratio line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.bench.harness import parse_ratio_line

BENCH_DIR = Path(__file__).resolve().parents[1]


def run(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH_DIR / script), *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.parametrize(
    ("script", "options"),
    [
        ("cli_startup.py", ["--smoke", "torchrun --help"]),
        ("agent.py", ["--only", "--smoke"]),
        ("rendezvous.py", ["--sizes", "--smoke"]),
        ("timer.py", ["--watchdog-calls", "--smoke"]),
        ("collectives.py", ["--backend", "--smoke"]),
        ("collectives_overhead.py", ["--smoke", "--rounds"]),
    ],
)
def test_help_runs_nothing(script: str, options: list[str]) -> None:
    proc = run(script, "--help")
    assert proc.returncode == 0, proc.stderr
    for option in options:
        assert option in proc.stdout


@pytest.mark.parametrize(
    ("script", "args", "option"),
    [
        ("agent.py", ["--only", "p2"], "--only"),
        ("rendezvous.py", ["--sizes", "2,x"], "--sizes"),
        ("rendezvous.py", ["--floor", "-1"], "--floor"),
        ("rendezvous.py", ["--etcd", "--floor", "1"], "--floor"),
    ],
)
def test_bad_arguments_exit_2(script: str, args: list[str], option: str) -> None:
    proc = run(script, *args)
    assert proc.returncode == 2
    assert option in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "args", "expected", "timeout"),
    [
        ("cli_startup.py", [], ["rallypoint --help", "torchrun --help"], 240),
        ("agent.py", ["--only", "p1"], ["P1 agent: whole command", "rallypoint --version", "headline (P1)"], 180),
        ("rendezvous.py", ["--sizes", "2"], ["rendezvous N=2", "headline at N=2"], 40),
        (
            "timer.py",
            [],
            ["timer 1/2: one recorded event", "target <= 2 us:", "timer 2/2: watchdog acquire + release"],
            60,
        ),
        ("collectives.py", [], ["gloo all_reduce 1MB", "barrier"], 120),
        ("collectives_overhead.py", [], ["all_reduce of 16 floats", "barrier"], 120),
    ],
)
def test_smoke_run_prints_the_ratio_last(script: str, args: list[str], expected: list[str], timeout: float) -> None:
    proc = run(script, "--smoke", *args, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    a, b, ratio = parse_ratio_line(proc.stdout)
    assert (a, b) == ("rallypoint", "torch")
    assert ratio > 0
    for text in expected:
        assert text in proc.stdout


@pytest.mark.slow
def test_a_rendezvous_floor_run_makes_no_rendezvous_and_gives_no_verdict() -> None:
    proc = run("rendezvous.py", "--smoke", "--backend", "grpc", "--sizes", "2", "--floor", "2", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "A floor:      grpc backend, 2 bare read(s) per node, no rendezvous" in proc.stdout
    assert "floor: rallypoint's side made 2 bare read(s) per node and no rendezvous" in proc.stdout
    assert "met" not in proc.stdout.split("summary:")[1]  # a floor is no rendezvous: no target verdict


@pytest.mark.slow
def test_a_json_file_names_its_run_as_the_stored_results_do(tmp_path: Path) -> None:
    out = tmp_path / "rdzv.json"
    proc = run("rendezvous.py", "--smoke", "--sizes", "2", "--json", str(out), timeout=40)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["sizes"]["2"]["labels"] == ["rallypoint", "torch"]
    run_ = data["run"]  # the keys of a run in docs/bench/*.json, less where it was recorded
    assert "rendezvous.py --smoke --sizes 2 --json" in run_["command"]
    assert run_["date"].endswith(" UTC")
    assert "load average" in run_["machine"]
