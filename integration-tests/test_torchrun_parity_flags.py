"""Every torchrun flag on ``rallypoint run``: the list comes from ``torchrun --help`` of the installed torch.

A flag is either mapped onto the job (``rallypoint run --dry-run`` shows the value with the flag as
its source) or refused with exit code 2 and a message saying why and what to use instead. A flag
that a new torch adds fails :func:`test_the_flag_table_is_torchruns`, until it is given a meaning.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rallypoint.agent.torchrun_flags import TORCHRUN_FLAGS
from rallypoint.core.cli import main

TORCHRUN = Path(sys.executable).with_name("torchrun")


def torchrun_flags() -> set[str]:
    """Every option string of ``torchrun --help`` (``-h``/``--help`` left out)."""
    text = subprocess.run([str(TORCHRUN), "--help"], capture_output=True, text=True, check=True, timeout=120).stdout
    options = text[text.index("options:") :]
    found: set[str] = set()
    for line in options.splitlines():
        if not re.match(r"  -[^-\s]|  --\w", line):  # an option's own line, not its help text
            continue
        head = line.strip()
        # "  --nproc-per-node NPROC_PER_NODE, --nproc_per_node NPROC_PER_NODE" / "  -m, --module   text"
        for part in re.split(r",\s+", re.split(r"\s{2,}", head)[0]):
            found.add(part.split()[0].split("=")[0])
    return found - {"-h", "--help"}


ACCEPTED: dict[str, tuple[list[str], str]] = {
    # flag: (the command line before the script, what --dry-run shows)
    "--nnodes": (["--nnodes", "1:2", "--rdzv-backend", "file", "--rdzv-endpoint", "{tmp}", "--rdzv-id", "r1"],
                 "max = 2  # --nnodes (command line)"),
    "--nproc-per-node": (["--nproc-per-node", "cpu"], f"nproc_per_node = {os.cpu_count()}  # --nproc-per-node"),
    "--rdzv-backend": (["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29411"],
                       'backend = "grpc"  # --rdzv-backend (command line)'),
    "--rdzv-endpoint": (["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1"],
                        'endpoint = "127.0.0.1:29400"  # --rdzv-endpoint (command line)'),
    "--rdzv-id": (["--rdzv-id", "r2"], 'run_id = "r2"  # --rdzv-id (command line)'),
    "--rdzv-conf": (["--rdzv-conf", "join_timeout=30,last_call_timeout=2"],
                    'last_call_timeout = "2s"  # --rdzv-conf last_call_timeout (command line)'),
    "--standalone": (["--standalone", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1"],  # ignored, as in torchrun
                     'backend = "memory"  # --standalone (command line)'),
    "--max-restarts": (["--max-restarts", "0"], "max_restarts = 0  # --max-restarts (command line)"),
    "--monitor-interval": (["--monitor-interval", "0.5"], 'monitor_interval = "500ms"  # --monitor-interval'),
    "--start-method": (["--start-method", "forkserver"], "# worker command:"),
    "--event-log-handler": (["--event-log-handler", "null"], "# worker command:"),
    "--role": (["--role", "trainer"], 'role = "trainer"  # --role (command line)'),
    "--module": (["--module", "json.tool"], 'module = "json.tool"  # SCRIPT (command line)'),
    "--no-python": (["--no-python", "/bin/true", "--"], "# worker command: /bin/true --"),
    "--log-dir": (["--log-dir", "{tmp}/logs"], "/logs\"  # --log-dir (command line)"),
    "--redirects": (["--redirects", "3"], 'tee = "none"  # --redirects (command line)'),
    "--tee": (["--tee", "3"], 'tee = "all"  # --tee (command line)'),
    "--node-rank": (["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1"],
                    'strategy = "env"  # --node-rank (command line)'),
    "--master-addr": (["--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.2"],
                      'endpoint = "127.0.0.2:29500"  # --master-addr/--master-port (command line)'),
    "--master-port": (["--nnodes", "2", "--node-rank", "0", "--master-port", "29512"],
                      'endpoint = "127.0.0.1:29512"  # --master-addr/--master-port (command line)'),
    "--local-addr": (["--local-addr", "127.0.0.3"], "at 127.0.0.3, 1 worker(s)"),
    "--signals-to-handle": (["--signals-to-handle", "SIGTERM,SIGUSR1"],
                            'signals_to_handle = "SIGTERM,SIGUSR1"  # --signals-to-handle (command line)'),
    "--shutdown-timeout": (["--shutdown-timeout", "5"], 'shutdown_timeout = "5s"  # --shutdown-timeout (command line)'),
}  # fmt: skip
REFUSED: dict[str, list[str]] = {
    "--event-log-handler": ["--event-log-handler", "console"],
    "--no-python": ["--no-python"],  # with a .py script
    "--run-path": ["--run-path"],
    "--redirects": ["--redirects", "0:1,1:2"],
    "--local-ranks-filter": ["--local-ranks-filter", "0"],
    "--duplicate-stdout-filters": ["--duplicate-stdout-filters", "loss"],
    "--duplicate-stderr-filters": ["--duplicate-stderr-filters", "loss"],
    "--logs-specs": ["--logs-specs", "mine"],
    "--numa-binding": ["--numa-binding", "node"],
    "--virtual-local-rank": ["--virtual-local-rank"],
}
BY_NAME = {name: flag for flag in TORCHRUN_FLAGS for name in flag.names}


def test_the_flag_table_is_torchruns() -> None:
    """Every torchrun flag, both spellings, is in rallypoint's table, and nothing else is."""
    ours = set(BY_NAME)
    theirs = torchrun_flags()
    assert theirs - ours == set(), "torchrun flags rallypoint does not know: give each a meaning in torchrun_flags.py"
    assert ours - theirs == set(), "flags in rallypoint's table that torchrun no longer has"
    for flag in TORCHRUN_FLAGS:
        assert flag.dest in {k.lstrip("-").replace("-", "_") for k in flag.names}
        assert flag.name in ACCEPTED or flag.name in REFUSED, f"{flag.name}: no test case"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["run", "--dry-run", *argv])
    out = capsys.readouterr()
    return code, out.out + out.err


def _spell(argv: list[str], name: str, spelling: str) -> list[str]:
    return [spelling if a == name else a for a in argv]


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_accepted_flags_map_onto_the_job(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv, shown = ACCEPTED[name]
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    tail = [] if name in ("--module", "--no-python") else [str(script)]
    for spelling in BY_NAME[name].names:  # every spelling: -t, --tee; --nproc-per-node, --nproc_per_node
        code, output = _run([*_spell(argv, name, spelling), *tail], capsys)
        assert code == 0, output
        assert shown.replace("{tmp}", str(tmp_path)) in output, output


@pytest.mark.parametrize(
    ("conf", "shown"),
    [
        ("heartbeat_timeout=45", 'heartbeat_timeout = "45s"  # --rdzv-conf heartbeat_timeout (command line)'),
        ("heartbeat_interval=2s", 'heartbeat_interval = "2s"  # --rdzv-conf heartbeat_interval (command line)'),
        ("keep_alive_interval=3", 'heartbeat_interval = "3s"  # --rdzv-conf keep_alive_interval (command line)'),
    ],
)
def test_rdzv_conf_takes_the_heartbeat_keys_of_the_torch_adapter(conf, shown, tmp_path, capsys) -> None:
    """``heartbeat_*`` work through ``rallypoint.rendezvous.torch_compat``; ``--rdzv-conf`` takes them too (#41)."""
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    code, output = _run(["--rdzv-conf", conf, str(script)], capsys)
    assert code == 0, output
    assert shown in output, output


def test_the_help_of_rdzv_conf_names_the_heartbeat_keys() -> None:
    # the migration page lists them; `rallypoint run --help` named keep_alive_interval only
    (flag,) = [f for f in TORCHRUN_FLAGS if "--rdzv-conf" in f.names]
    for key in ("heartbeat_interval", "heartbeat_timeout", "keep_alive_interval", "is_host", "read_timeout"):
        assert key in flag.help, flag.help


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_flags_say_why_and_what_instead(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    for spelling in BY_NAME[name].names:
        code, output = _run([*_spell(REFUSED[name], name, spelling), str(script)], capsys)
        assert code == 2, output
        assert f"{BY_NAME[name].name}:" in output, output
        assert "No such option" not in output
        assert re.search(r"\b(use|drop|instead|run|give|select|pick|filter|start)\b", output.split(":", 2)[-1]), output


def test_gpu_needs_a_visible_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    code, output = _run(["--nproc-per-node", "gpu", str(tmp_path / "x.py")], capsys)
    assert code == 2, output
    assert "no GPU is visible" in output, output
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    (tmp_path / "x.py").write_text("")
    code, output = _run(["--nproc_per_node", "gpu", str(tmp_path / "x.py")], capsys)
    assert code == 0, output
    assert "nproc_per_node = 3  # --nproc-per-node" in output, output


def test_static_rendezvous_checks_its_node_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "x.py").write_text("")
    code, output = _run(["--nnodes", "2", "--node-rank", "2", "--master-addr", "h0", str(tmp_path / "x.py")], capsys)
    assert code == 2, output
    assert "node rank 2 is not below --nnodes 2" in output, output
    code, output = _run(["--nnodes", "1:2", "--node-rank", "0", str(tmp_path / "x.py")], capsys)
    assert code == 2, output
    assert "static rendezvous needs a fixed --nnodes" in output, output


def test_help_states_the_defaults_that_differ(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--help"]) == 0
    text = capsys.readouterr().out
    assert "3 (torchrun: 0)" in text
    assert "runs/{run_id} (torchrun: a temporary directory)" in text


LIGHT = """
import sys
from rallypoint.core.cli import main
code = main(sys.argv[1:])
heavy = sorted(m for m in ("torch", "grpc", "etcd3", "numpy") if m in sys.modules)
print("HEAVY=" + ",".join(heavy))
"""


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["--version"], ["run", "--help"], ["run", "--dry-run", "--nproc_per_node", "2", "train.py"],
     ["config", "show"], ["config", "schema"], ["status", "--help"]],
)  # fmt: skip
def test_the_cli_stays_light(argv: list[str], tmp_path: Path) -> None:
    """No torch, gRPC or etcd import for help, versions, config and status (nor a dry run)."""
    (tmp_path / "train.py").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")}
    proc = subprocess.run(
        [sys.executable, "-c", LIGHT, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.stdout.splitlines()[-1] == "HEAVY=", proc.stdout[-2000:] + proc.stderr


def test_nodes_with_different_roles_are_not_one_job(tmp_path: Path) -> None:
    """``--role`` is the job's: a node giving another role is refused (exit 2), as a different job."""
    (tmp_path / "train.py").write_text("import time; time.sleep(0.2)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")}
    cli = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()", "run"]
    common = ["--nnodes", "2", "--rdzv-backend", "file", "--rdzv-endpoint", str(tmp_path / "rdzv"),
              "--rdzv-id", "roles", "--rdzv-conf", "join_timeout=20"]  # fmt: skip
    first = subprocess.Popen([*cli, *common, "--role", "trainer", "train.py"], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "rdzv" / "roles").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        second = subprocess.run([*cli, *common, "--role", "eval", "train.py"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=120)  # fmt: skip
    finally:
        first.kill()
        first.communicate()
    assert second.returncode == 2, second.stdout + second.stderr
    assert "trainer" in second.stderr, second.stderr


def test_torchruns_pet_variables_stand_for_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``PET_<FLAG>`` gives a flag the command line leaves out, as with torchrun; the command line wins."""
    (tmp_path / "x.py").write_text("")
    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")
    monkeypatch.setenv("PET_MAX_RESTARTS", "1")
    monkeypatch.setenv("PET_STANDALONE", "1")
    monkeypatch.setenv("PET_LOCAL_ADDR", "127.0.0.7")
    code, output = _run(["--max-restarts", "2", str(tmp_path / "x.py")], capsys)
    assert code == 0, output
    assert "nproc_per_node = 3  # PET_NPROC_PER_NODE (environment)" in output
    assert "max_restarts = 2  # --max-restarts (command line)" in output
    assert 'backend = "memory"  # PET_STANDALONE (environment)' in output
    assert "at 127.0.0.7, 3 worker(s)" in output
    monkeypatch.setenv("PET_STANDALONE", "0")
    monkeypatch.setenv("PET_RUN_PATH", "1")
    code, output = _run([str(tmp_path / "x.py")], capsys)
    assert code == 2, output
    assert "--run-path:" in output
