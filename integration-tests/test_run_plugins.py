"""Agent hooks from a third-party plugin, ``rallypoint status``, and the live waiting line."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

RALLYPOINT = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]

PLUGIN = """
import os
from pydantic import BaseModel, ConfigDict
from rallypoint.collectives.records import CollectiveBackendRecord
from rallypoint.core.plugins import hookimpl

OUT = os.environ["ACME_OUT"]

class TunedOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    buffer_mb: int = 4
    algorithm: str = "ring"

@hookimpl
def rallypoint_collective_backends():
    return [CollectiveBackendRecord(name="acme-tuned", torch_backend="gloo", options_model=TunedOptions)]

def note(name, text):
    with open(os.path.join(OUT, name), "a") as f:
        f.write(text + "\\n")

@hookimpl
def rallypoint_worker_env(worker):
    return {"ACME_RANK_PLUS_100": str(worker.ranks.rank + 100), "RANK": "999"}

@hookimpl
def rallypoint_agent_workers_started(group):
    note("started", ",".join(str(r) for r in sorted(group.pids)))

@hookimpl
def rallypoint_agent_worker_failed(failure):
    note("failed", f"{failure.rank}:{failure.reason}")

@hookimpl
def rallypoint_agent_should_restart(failure):
    return False
"""

WORKER = """
import os, sys, time
out = sys.argv[1]
with open(os.path.join(out, "worker" + os.environ["RANK"]) + ".tmp", "w") as f:
    f.write(os.environ["ACME_RANK_PLUS_100"])
os.replace(os.path.join(out, "worker" + os.environ["RANK"]) + ".tmp", os.path.join(out, "worker" + os.environ["RANK"]))
if os.environ["RANK"] == "1":
    # fail only once rank 0 has written its file: the agent stops rank 0 when rank 1 fails
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(out, "worker0")) and time.monotonic() < deadline:
        time.sleep(0.01)
    sys.exit(3)
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")}
    env.update(extra)
    return env


def _install_plugin(site: Path) -> None:
    site.mkdir()
    (site / "acme_hooks.py").write_text(textwrap.dedent(PLUGIN))
    info = site / "acme_hooks-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-hooks\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[rallypoint]\nacme = acme_hooks\n")


def test_agent_hooks_of_a_third_party_plugin_run(tmp_path: Path) -> None:
    _install_plugin(tmp_path / "site")
    (tmp_path / "worker.py").write_text(textwrap.dedent(WORKER))
    result = subprocess.run(
        [
            *RALLYPOINT,
            "run",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "3",
            "--run-id",
            "hooks",
            str(tmp_path / "worker.py"),
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=_env(PYTHONPATH=str(tmp_path / "site"), ACME_OUT=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    # rallypoint_worker_env added a variable but could not override RANK
    assert (tmp_path / "worker0").read_text() == "100"
    assert (tmp_path / "worker1").read_text() == "101"
    assert (tmp_path / "started").read_text() == "0,1\n"
    assert (tmp_path / "failed").read_text() == "1:exit code 3\n"
    # rallypoint_agent_should_restart said no, although the budget had 3 restarts left
    assert result.returncode == 1, result.stderr
    assert "a rallypoint_agent_should_restart hook declined the restart" in result.stderr
    assert "job 'hooks' failed after 0 of 3 restart(s)" in result.stderr


SHOW_COLLECTIVES = """
import json, os, sys
keys = ("RALLYPOINT_COLLECTIVES_BACKEND", "RALLYPOINT_COLLECTIVES_TIMEOUT", "RALLYPOINT_COLLECTIVES_OPTIONS")
with open(os.path.join(sys.argv[1], "env" + os.environ["RANK"]), "w") as f:
    json.dump({k: os.environ.get(k) for k in keys}, f)
"""


def test_collectives_options_reach_the_workers_validated(tmp_path: Path) -> None:
    _install_plugin(tmp_path / "site")
    (tmp_path / "show.py").write_text(textwrap.dedent(SHOW_COLLECTIVES))
    (tmp_path / "job.toml").write_text(
        f'job.entrypoint = "show.py"\njob.args = ["{tmp_path}"]\n'
        '[collectives]\nbackend = "acme-tuned"\ntimeout = "45s"\n[collectives.options]\nbuffer_mb = 16\n'
    )
    result = subprocess.run(
        [*RALLYPOINT, "run", "--nproc-per-node", "2", "--run-id", "coll", "job.toml"],
        cwd=tmp_path,
        env=_env(PYTHONPATH=str(tmp_path / "site"), ACME_OUT=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"env{rank}").read_text())
        assert seen["RALLYPOINT_COLLECTIVES_BACKEND"] == "acme-tuned"
        assert seen["RALLYPOINT_COLLECTIVES_TIMEOUT"] == "45"
        # validated once by the agent's config resolution: defaults filled in, as JSON
        assert json.loads(seen["RALLYPOINT_COLLECTIVES_OPTIONS"]) == {"buffer_mb": 16, "algorithm": "ring"}


def test_invalid_collectives_options_stop_the_job_before_any_worker_runs(tmp_path: Path) -> None:
    _install_plugin(tmp_path / "site")
    (tmp_path / "show.py").write_text(textwrap.dedent(SHOW_COLLECTIVES))
    result = subprocess.run(
        [
            *RALLYPOINT,
            "run",
            "--set",
            "collectives.backend=acme-tuned",
            "--set",
            "collectives.options.buffer_mb=lots",
            "show.py",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=_env(PYTHONPATH=str(tmp_path / "site"), ACME_OUT=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "collectives.options.buffer_mb" in result.stderr
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.glob("env*"))


def _start_agent(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    """``rallypoint run ARGS`` in the background (its stderr kept for the assertion messages)."""
    return subprocess.Popen(
        [*RALLYPOINT, "run", *args],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_status_shows_a_running_job(tmp_path: Path) -> None:
    (tmp_path / "sleep.py").write_text("import time\ntime.sleep(600)\n")  # until the test kills the agent
    rdzv = str(tmp_path / "rdzv")
    flags = ["--rdzv-backend", "file", "--rdzv-endpoint", rdzv, "--run-id", "st", "--node-id", "solo"]
    agent = _start_agent(tmp_path, *flags, str(tmp_path / "sleep.py"))
    try:
        deadline = time.monotonic() + 60
        while True:
            status = subprocess.run(
                [*RALLYPOINT, "status", "--rdzv-backend", "file", "--rdzv-endpoint", rdzv, "--run-id", "st"],
                cwd=tmp_path,
                env=_env(),
                capture_output=True,
                text=True,
                timeout=60,
            )
            if "running" in status.stdout or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        agent.kill()
        agent.wait()
    assert status.returncode == 0, status.stderr
    assert "run:       st" in status.stdout
    assert "round:     0 (running)" in status.stdout
    assert "  0: solo" in status.stdout
    assert "restarts:  0" in status.stdout

    missing = subprocess.run(
        [*RALLYPOINT, "status", "--rdzv-backend", "file", "--rdzv-endpoint", rdzv, "--run-id", "nope"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 1
    # read-only: an error naming the directory it looked for (and nothing created)
    assert f"no rendezvous state for run 'nope': no rendezvous directory {rdzv}/nope" in missing.stderr
    assert not (Path(rdzv) / "nope").exists()


def test_a_terminal_shows_a_live_line_while_waiting_for_nodes(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("pass\n")
    main, child = pty.openpty()
    agent = subprocess.Popen(
        [
            *RALLYPOINT,
            "run",
            "--nnodes",
            "2",
            "--rdzv-backend",
            "file",
            "--rdzv-endpoint",
            str(tmp_path / "rdzv"),
            "--run-id",
            "wait",
            "--set",
            "rendezvous.join_timeout=3s",
            str(tmp_path / "x.py"),
        ],
        cwd=tmp_path,
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=child,
        stderr=child,
    )
    os.close(child)
    seen = b""
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and agent.poll() is None:
            ready, _, _ = select.select([main], [], [], 0.2)
            if ready:
                try:
                    seen += os.read(main, 4096)
                except OSError:
                    break
        agent.wait(timeout=30)
    finally:
        agent.kill()
        os.close(main)
    text = seen.decode(errors="replace")
    assert "waiting for nodes: 1 joined (min 2, max 2)" in text
    # and the join timeout ends it with the timeout error naming what was missing
    assert agent.returncode != 0
    assert "join" in text


def _status(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RALLYPOINT, "status", *args], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60
    )


def test_status_shows_the_default_one_node_job_running_and_ended(tmp_path: Path) -> None:
    """The memory backend lives in the agent: status reads the status.json the agent writes (#41 item 4).

    It used to refuse with exit 2 ("needs a shared backend") for the job a newcomer runs first.
    """
    nothing = _status(tmp_path)  # before any job: says where it looked and what to do
    assert nothing.returncode == 1
    assert "no status.json under 'runs/{run_id}'" in nothing.stdout, nothing.stdout + nothing.stderr
    (tmp_path / "go").write_text("")
    script = "import os, time\nwhile os.path.exists('go'):\n    time.sleep(0.05)\n"  # until the test lets it end
    (tmp_path / "wait.py").write_text(script)
    agent = _start_agent(tmp_path, "--node-id", "solo", str(tmp_path / "wait.py"))
    try:
        deadline = time.monotonic() + 60
        while "(running)" not in (running := _status(tmp_path)).stdout and time.monotonic() < deadline:
            time.sleep(0.2)
        (tmp_path / "go").unlink()
        _, err = agent.communicate(timeout=60)
    finally:
        agent.kill()
        agent.wait()
    assert agent.returncode == 0, err
    assert running.returncode == 0, running.stdout + running.stderr
    assert "round:     0 (running)" in running.stdout
    assert "  0: solo  host " in running.stdout
    assert "1 worker(s): 0 running" in running.stdout
    run_id = running.stdout.split()[1]  # "run:       job-..." names the generated run id
    assert f"(from runs/{run_id}/status.json, written by the job's agent)" in running.stdout
    ended = _status(tmp_path, "--json")
    assert ended.returncode == 0, ended.stderr
    snap = json.loads(ended.stdout)
    assert (snap["run_id"], snap["state"], snap["succeeded"]) == (run_id, "succeeded", True)
    assert snap["ranks"] == {"0": "succeeded"}
    assert snap["source"] == f"runs/{run_id}/status.json"
    assert oct((tmp_path / snap["source"]).stat().st_mode & 0o777) == oct(0o600)  # private, as the logs
    assert _status(tmp_path, "--run-id", "other").returncode == 1


def test_status_shows_a_finished_c10d_job_its_agent_served(tmp_path: Path) -> None:
    """A c10d rendezvous ends with the agent that served it: status reads what that agent left (#41 item 4).

    It used to say "no rendezvous state (not started...)" for a job that had just finished.
    """
    import socket

    (tmp_path / "ok.py").write_text("pass\n")
    with socket.socket() as probe:  # a free port: the endpoint needs a fixed one
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    flags = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--run-id", "c10d-done"]
    done = subprocess.run(
        [*RALLYPOINT, "run", *flags, str(tmp_path / "ok.py")],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = _status(tmp_path, *flags)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "round:     0 (closed)" in shown.stdout
    assert "ended:     job succeeded" in shown.stdout
    assert "(from runs/c10d-done/status.json, written by the job's agent)" in shown.stdout
