"""Tests of the benchmark harness with fake sides and a fake clock, plus a smoke run of cli_startup."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools.bench.harness import (
    RATIO_RE,
    BenchmarkError,
    Command,
    bench_parser,
    compare,
    format_ratio,
    format_report,
    parse_ratio_line,
    ratio_line,
    run_benchmark,
    run_info,
    schedule,
    settings_from_args,
)

BENCH_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = BENCH_DIR.parents[1]


class FakeClock:
    """A clock that only moves when a fake side says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_side(name: str, clock: FakeClock, durations: list[float], calls: list[str]):
    """A side that records its call and advances the clock by its next duration."""
    it = iter(durations)

    def side() -> None:
        calls.append(name)
        clock.now += next(it)

    return side


# ------------------------------------------------------------------------------------------------
# alternation


def test_schedule_flips_order_every_round():
    assert schedule(4) == [("a", "b"), ("b", "a"), ("a", "b"), ("b", "a")]
    assert schedule(2, start=1) == [("b", "a"), ("a", "b")]
    assert schedule(0) == []


def test_compare_alternates_and_discards_warmup():
    clock = FakeClock()
    calls: list[str] = []
    a = make_side("a", clock, [1.0] * 10, calls)
    b = make_side("b", clock, [2.0] * 10, calls)
    result = compare(a, b, rounds=4, warmup=2, clock=clock)
    # warm-up: A B, B A; measured rounds continue the alternation: A B, B A, A B, B A
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b", "b", "a"]
    assert result.order == ("a", "b", "b", "a", "a", "b", "b", "a")
    assert len(result.a.samples) == len(result.b.samples) == 4


def test_compare_without_warmup_starts_with_a():
    clock = FakeClock()
    calls: list[str] = []
    compare(
        make_side("a", clock, [1.0] * 3, calls),
        make_side("b", clock, [1.0] * 3, calls),
        rounds=3,
        warmup=0,
        clock=clock,
    )
    assert calls == ["a", "b", "b", "a", "a", "b"]


def test_number_calls_each_side_k_times_per_sample_and_averages():
    clock = FakeClock()
    calls: list[str] = []
    result = compare(
        make_side("a", clock, [1.0, 3.0, 2.0, 2.0], calls),
        make_side("b", clock, [4.0] * 4, calls),
        rounds=2,
        warmup=0,
        number=2,
        clock=clock,
    )
    assert calls == ["a", "a", "b", "b", "b", "b", "a", "a"]
    assert result.a.samples == (2.0, 2.0)
    assert result.b.samples == (4.0, 4.0)


def test_progress_sees_every_measured_sample_in_order():
    clock = FakeClock()
    seen = []
    compare(
        make_side("a", clock, [1.0] * 3, []),
        make_side("b", clock, [2.0] * 3, []),
        rounds=2,
        warmup=1,
        labels=("rp", "torch"),
        clock=clock,
        progress=lambda i, label, s: seen.append((i, label, s)),
    )
    assert seen == [(0, "torch", 2.0), (0, "rp", 1.0), (1, "rp", 1.0), (1, "torch", 2.0)]


# ------------------------------------------------------------------------------------------------
# statistics and ratio


def test_median_min_max_and_ratio():
    clock = FakeClock()
    a = make_side("a", clock, [9.0, 1.0, 3.0, 2.0, 100.0], [])
    b = make_side("b", clock, [4.0, 6.0, 5.0, 50.0, 5.0], [])
    result = compare(a, b, rounds=5, warmup=0, clock=clock, labels=("rallypoint", "torch"))
    assert result.a.samples == (9.0, 1.0, 3.0, 2.0, 100.0)
    assert (result.a.median, result.a.min, result.a.max) == (3.0, 1.0, 100.0)
    assert (result.b.median, result.b.min, result.b.max) == (5.0, 4.0, 50.0)
    assert result.ratio == pytest.approx(0.6)


def test_median_of_even_count_is_the_mean_of_the_middle_two():
    clock = FakeClock()
    result = compare(
        make_side("a", clock, [1.0, 2.0, 3.0, 10.0], []),
        make_side("b", clock, [1.0] * 4, []),
        rounds=4,
        warmup=0,
        clock=clock,
    )
    assert result.a.median == 2.5
    assert result.ratio == 2.5


def test_ratio_with_a_zero_b_median_does_not_divide_by_zero():
    clock = FakeClock()
    result = compare(
        make_side("a", clock, [1.0], []), make_side("b", clock, [0.0], []), rounds=1, warmup=0, clock=clock
    )
    assert ratio_line(result) == "ratio A/B: infx"


@pytest.mark.parametrize(
    ("ratio", "text"),
    [
        (0.4213, "0.421"),
        (0.04213, "0.0421"),
        (1.0, "1.00"),
        (12.345, "12.3"),
        (1234.5, "1234"),
    ],
)
def test_format_ratio_keeps_three_significant_digits(ratio, text):
    assert format_ratio(ratio) == text


@pytest.mark.parametrize(
    "kwargs", [{"rounds": 0}, {"warmup": -1}, {"number": 0}, {"labels": ("two words", "b")}, {"labels": ("a/b", "c")}]
)
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(BenchmarkError):
        compare(lambda: None, lambda: None, **kwargs)


# ------------------------------------------------------------------------------------------------
# report


def _fixed_comparison():
    clock = FakeClock()
    return compare(
        make_side("a", clock, [0.010, 0.012, 0.011], []),
        make_side("b", clock, [0.100, 0.090, 0.110], []),
        rounds=3,
        warmup=0,
        clock=clock,
        labels=("rallypoint", "torch"),
    )


def test_report_table_has_both_sides_and_ends_with_the_ratio_line():
    text = format_report(_fixed_comparison(), title="demo", details=["A: x", "B: y"])
    lines = text.splitlines()
    assert lines[:3] == ["demo", "A: x", "B: y"]
    assert lines[-1] == "ratio rallypoint/torch: 0.110x"
    assert RATIO_RE.match(lines[-1])
    rp_row = next(line for line in lines if line.startswith("rallypoint "))
    assert rp_row.split() == ["rallypoint", "11.00", "ms", "10.00", "ms", "12.00", "ms", "3"]
    torch_row = next(line for line in lines if line.startswith("torch "))
    assert torch_row.split()[1:3] == ["100.0", "ms"]


def test_parse_ratio_line_round_trips():
    text = format_report(_fixed_comparison()) + "\n"
    assert parse_ratio_line(text) == ("rallypoint", "torch", 0.11)
    with pytest.raises(ValueError, match="not a ratio line"):
        parse_ratio_line(text + "trailing noise\n")


def test_run_benchmark_prints_report_last_and_writes_json(tmp_path):
    args = bench_parser("demo").parse_args(["--smoke", "--json", str(tmp_path / "r.json")])
    assert settings_from_args(args) == {"rounds": 2, "warmup": 1, "number": 1}
    out = io.StringIO()
    calls: list[str] = []
    result = run_benchmark(
        args, lambda: calls.append("a"), lambda: calls.append("b"), labels=("x", "y"), title="demo", out=out
    )
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert out.getvalue().rstrip("\n").splitlines()[-1].startswith("ratio x/y: ")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["title"] == "demo"
    assert data["rounds"] == 2
    assert data["warmup"] == 1
    assert len(data["sides"]["x"]["samples"]) == 2
    assert data["ratio"] == result.ratio
    assert set(data["run"]) == {"date", "command", "machine"}  # what docs/bench/*.json needs of a run


def test_run_info_names_the_command_date_and_load(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "tools" / "bench" / "demo.py"
    info = run_info([str(script), "--rounds", "3", "--sizes", "2,8"])
    assert info["command"] == "python tools/bench/demo.py --rounds 3 --sizes 2,8"
    assert re.fullmatch(r"20\d\d-\d\d-\d\d \d\d:\d\d UTC", info["date"])
    assert re.fullmatch(r"\d+ CPUs, load average [\d.]+ / [\d.]+ / [\d.]+ at the end", info["machine"])
    assert run_info(["/elsewhere/x.py", "a b"])["command"] == "python /elsewhere/x.py 'a b'"


def test_parser_defaults_and_overrides():
    parser = bench_parser("demo", rounds=7, warmup=3, number=100)
    args = parser.parse_args([])
    assert settings_from_args(args) == {"rounds": 7, "warmup": 3, "number": 100}
    args = parser.parse_args(["--rounds", "4", "--warmup", "0"])
    assert settings_from_args(args) == {"rounds": 4, "warmup": 0, "number": 100}
    assert settings_from_args(argparse.Namespace(rounds=5, warmup=2)) == {"rounds": 5, "warmup": 2, "number": 1}


# ------------------------------------------------------------------------------------------------
# commands


def test_command_runs_with_extra_env_and_reports_failures(tmp_path):
    marker = tmp_path / "seen"
    ok = Command(
        [sys.executable, "-c", "import os, pathlib; pathlib.Path(os.environ['OUT']).write_text('hi')"],
        env={"OUT": str(marker)},
    )
    ok()
    assert marker.read_text() == "hi"
    bad = Command([sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"])
    with pytest.raises(BenchmarkError, match=r"exited with 3(.|\n)*boom"):
        bad()
    with pytest.raises(BenchmarkError, match="cannot run"):
        Command([str(tmp_path / "no-such-program")])()
    assert Command(["/usr/bin/echo", "a b", "c"]).describe() == "echo 'a b' c"


def test_command_without_inherited_env_sees_only_its_own(tmp_path):
    out = tmp_path / "env.json"
    Command(
        [sys.executable, "-c", f"import json, os; open({str(out)!r}, 'w').write(json.dumps(dict(os.environ)))"],
        env={"ONLY": "1"},
        inherit_env=False,
    )()
    env = json.loads(out.read_text())
    assert env.get("ONLY") == "1"
    assert "PATH" not in env


def _subprocess_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def test_harness_does_not_import_torch():
    code = "import sys, tools.bench.harness; print('torch' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=_subprocess_env(), cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert proc.stdout.strip() == "False"
