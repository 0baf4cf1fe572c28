"""tools/bench/page.py and results.py: the benchmarks page is what its stored results give.

The summary table, the fault table, the runs table and the charts of docs/benchmarks.md are
rebuilt from docs/bench/*.json; the first test fails when someone edits the page or a chart by
hand, or a results file without rebuilding. The others check that a malformed results file is
refused with its name and key, and that targets are judged from the figures.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.bench import page
from tools.bench.results import RESULTS_DIR, ResultsError, load_all, load_family, parse_figure, target_met

FAMILIES = {
    "rendezvous", "agent", "warm_workers", "collectives", "rpc", "autograd", "debug", "faults", "grpc_server_scale",
}  # fmt: skip


def test_the_page_and_its_charts_are_what_the_stored_results_give() -> None:
    assert page.stale() == [], "run: .venv/bin/python tools/bench/page.py"


def test_every_benchmark_family_has_a_valid_results_file() -> None:
    families = load_all()
    assert set(families) == FAMILIES
    for name, data in families.items():
        if name == "grpc_server_scale":
            continue
        for run in data["runs"].values():
            assert run["date"].startswith("2026-"), (name, run)
            assert "tools/" in run["command"], (name, run)


def test_the_page_quotes_every_summary_figure_and_each_target() -> None:
    text = page.PAGE.read_text()
    for data in load_all().values():
        for r in data.get("results", []):
            if r.get("summary"):
                assert (r["rallypoint"] or r["outcome"]) in text, r
                if r.get("target"):
                    assert f"<= {r['target']['max']}" in text, r


def test_the_check_command_passes_on_the_repository() -> None:
    proc = subprocess.run(
        [sys.executable, str(Path(page.__file__)), "--check"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _copy(tmp_path: Path) -> tuple[Path, Path]:
    directory = tmp_path / "bench"
    shutil.copytree(RESULTS_DIR, directory)
    target = tmp_path / "benchmarks.md"
    shutil.copy(page.PAGE, target)
    return target, directory


def _edit(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2) + "\n")


def test_a_changed_figure_makes_the_page_stale_until_it_is_rebuilt(tmp_path: Path) -> None:
    md, directory = _copy(tmp_path)
    assert page.stale(md, directory) == []

    def faster(data):
        p1 = next(r for r in data["results"] if r["id"] == "P1")
        p1.update(rallypoint="2.000 s", ratio="0.417x")  # 2.000 / 4.801

    _edit(directory / "agent.json", faster)
    assert sorted(page.stale(md, directory)) == sorted([str(md), str(directory / "agent.svg")])
    page.stale(md, directory, write=True)
    assert page.stale(md, directory) == []
    row = next(line for line in md.read_text().splitlines() if line.startswith("| P1 |"))
    assert "| 2.000 s |" in row
    assert "| 0.417x |" in row
    assert "| met |" in row


def test_a_ratio_that_does_not_match_its_figures_is_refused(tmp_path: Path) -> None:
    _, directory = _copy(tmp_path)
    _edit(directory / "agent.json", lambda d: d["results"][0].update(ratio="0.527x"))
    with pytest.raises(
        ResultsError, match=r"agent\.json, results\[0\].*ratio 0\.527x does not match 3\.012 s / 4\.801 s"
    ):
        load_family(directory / "agent.json")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["runs"]["agent-2026-11-29"].pop("command"), r"run 'agent-2026-11-29': missing key\(s\) command"),
        (lambda d: d["results"][0].update(run="nope"), r"results\[0\].*run 'nope' is not one of the file's runs"),
        (lambda d: d["results"][0].update(rallypoint="3 seconds"), r"results\[0\].*key 'rallypoint': '3 seconds'"),
        (
            lambda d: d["results"][2].update(rallypoint="35.1 ms", ratio=None),
            r"results\[2\].*a ratio target \(0.2x\) needs a ratio",
        ),
        (lambda d: d["results"][0].update(rallypoint=None, ratio=None), r"'rallypoint' is null, so 'outcome'"),
        (lambda d: d["results"][0].update(target={"max": "fast"}), r"key 'target'"),
        (lambda d: d.pop("script"), r"missing key\(s\) script"),
        (lambda d: d["results"].pop(1), r"run\(s\) agent-2026-11-29 quoted by no result"),
    ],
)
def test_a_malformed_family_is_refused_naming_the_file_and_key(tmp_path: Path, edit, message: str) -> None:
    _, directory = _copy(tmp_path)
    _edit(directory / "agent.json", edit)
    if "quoted by no result" in message:  # both agent-2026-11-29 results must go
        _edit(directory / "agent.json", lambda d: d["results"].pop(1))
    with pytest.raises(ResultsError, match=message):
        load_family(directory / "agent.json")


def test_a_fault_figure_must_be_one_of_its_scenario(tmp_path: Path) -> None:
    _, directory = _copy(tmp_path)
    _edit(directory / "faults.json", lambda d: d["results"][0].update(rallypoint="6.00 s"))
    with pytest.raises(ResultsError, match=r"6\.00 s is not a figure of scenario 'worker crash"):
        load_family(directory / "faults.json")


def test_a_family_named_unlike_its_file_is_refused(tmp_path: Path) -> None:
    _, directory = _copy(tmp_path)
    _edit(directory / "rpc.json", lambda d: d.update(family="rpcs"))
    with pytest.raises(ResultsError, match=r"rpc\.json: key 'family' is 'rpcs'"):
        load_all(directory)


def test_targets_are_judged_on_the_ratio_or_the_figure() -> None:
    assert target_met({"ratio": "0.295x", "rallypoint": "72.36 ms", "target": {"max": "0.3x"}}) is True
    assert target_met({"ratio": "0.627x", "rallypoint": "3.012 s", "target": {"max": "0.45x"}}) is False
    assert target_met({"ratio": None, "rallypoint": "11.25 s", "target": {"max": "15 s"}}) is True
    assert target_met({"ratio": None, "rallypoint": None, "target": {"max": "2 s"}}) is False
    assert target_met({"ratio": "1.0x", "rallypoint": "1 s"}) is None
    assert parse_figure("1404 us").value == pytest.approx(1.404e-3)


def test_several_runs_share_a_row_with_their_range_and_how_many_miss() -> None:
    table = page.summary_table(load_all())
    row = next(line for line in table.splitlines() if "all_reduce 1 MB" in line)
    assert "| 1404 us, 1865 us, 1238 us |" in row
    assert "| 0.920x to 1.05x |" in row
    assert "**missed** in 1 of 3 runs" in row  # 1.05x > 1.03x in the second run


def test_a_page_without_a_generated_block_is_refused() -> None:
    text = page.PAGE.read_text().replace("<!-- generated: runs -->\n", "")
    with pytest.raises(ValueError, match=r"no '<!-- generated: NAME -->' block for \['runs'\]"):
        page.render_page(text, load_all())


def test_bad_results_exit_2_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    md, directory = _copy(tmp_path)
    (directory / "rpc.json").write_text("{")
    assert page.main(["--check", "--page", str(md), "--results", str(directory)]) == 2
    assert "rpc.json: cannot read it as JSON" in capsys.readouterr().err


def test_check_exits_1_naming_a_chart_edited_by_hand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    md, directory = _copy(tmp_path)
    (directory / "rpc.svg").write_text("<svg/>")
    assert page.main(["--check", "--page", str(md), "--results", str(directory)]) == 1
    assert f"not current: {directory / 'rpc.svg'}" in capsys.readouterr().out
    assert page.main(["--page", str(md), "--results", str(directory)]) == 0
    assert page.main(["--check", "--page", str(md), "--results", str(directory)]) == 0
