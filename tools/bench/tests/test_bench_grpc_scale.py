"""tools/bench/grpc_server_scale.py: a small round completes, checked, with the server's and clients' figures."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "grpc_server_scale.py"


@pytest.mark.slow
def test_a_small_server_scale_round_completes_and_reports_cpu_and_memory() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--nodes", "24", "--procs", "2"], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "grpc server scale: 24 nodes (2 client processes x 12 threads, one channel each)" in out
    for line in ("one round, release to last next_rendezvous() return:", "server CPU during the round:"):
        assert line in out
    assert "client processes' CPU during the round:" in out
    assert "server memory:" in out
    received = float(out.split("bytes per node (TCP payload, gRPC framing included): ")[1].split()[0])
    assert received > 100  # every node received at least its replies


@pytest.mark.slow
def test_several_sizes_store_json_and_draw_an_svg_chart(tmp_path: Path) -> None:
    data, chart = tmp_path / "scale.json", tmp_path / "scale.svg"
    cmd = [sys.executable, str(SCRIPT), "--nodes", "8,16", "--procs", "2", "--json", str(data), "--plot", str(chart)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(data.read_text())
    assert [r["nodes"] for r in result["rounds"]] == [8, 16]
    for r in result["rounds"]:
        assert r["wall_s"] > 0
        assert r["server_cpu_s"] >= 0
        assert r["bytes_received_per_node"] > 100
        assert r["server_peak_mib"] >= r["server_rss_mib_before"]
    svg = ET.fromstring(chart.read_text())
    assert len(list(svg.iter("{http://www.w3.org/2000/svg}circle"))) == 4  # two sizes on each of two panels


@pytest.mark.slow
@pytest.mark.parametrize("client", ["threads", "aio"])
def test_a_floor_run_makes_bare_calls_and_says_so(client: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--nodes", "16", "--procs", "2", "--floor", "2", "--floor-client", client],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kind = "asyncio tasks" if client == "aio" else "threads"
    assert f"grpc server scale: 16 nodes (2 client processes x 8 {kind}, one channel each)" in proc.stdout
    assert f"floor: 2 bare Get call(s) per node, no rendezvous protocol ({client} clients)" in proc.stdout
    assert "release to the last node's last call:" in proc.stdout
    assert "one round" not in proc.stdout


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--floor", "-1"], "--floor"),
        (["--floor-client", "aio"], "--floor"),
        (["--plot", "chart.png"], "--plot"),
        (["--nodes", "0"], "--nodes"),
        (["--torch", "2,x"], "--torch"),
        (["--procs", "0"], "--procs"),
    ],
)
def test_bad_arguments_exit_2(args: list[str], named: str) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert named in proc.stderr


def test_a_round_whose_server_cpu_reads_zero_is_left_out_of_the_cpu_panel() -> None:
    """Server CPU is read in clock ticks (10 ms): a small round can read 0, which a log scale cannot draw."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_grpc_server_scale", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    sys.path.insert(0, str(SCRIPT.parents[2]))
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parents[2]))
    rounds = [{"nodes": 8, "server_cpu_s": 0.0, "wall_s": 0.03}, {"nodes": 16, "server_cpu_s": 0.01, "wall_s": 0.05}]
    svg = module._chart(rounds, [], "test")
    ET.fromstring(svg)  # well-formed
    assert "Server CPU per node" in svg
    assert "below one clock tick at N = 8" in svg
    only_zero = module._chart(rounds[:1], [], "test")
    assert "Server CPU per node" not in only_zero
    assert "Round wall time" in only_zero
