"""torchrun's ``--signals-to-handle`` and ``--shutdown-timeout`` on ``rallypoint run``.

The agent handles the signals named (SIGUSR1 here, which a default agent would die of), stops
the workers with the same signal, gives them the shutdown timeout, and exits 128+N, as torchrun
does. Workers see the list in ``TORCHELASTIC_SIGNALS_TO_HANDLE``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CLI = [sys.executable, "-c", "from rallypoint.core.cli import entrypoint; entrypoint()"]
WORKER = """
import os, signal, sys, time
out = sys.argv[1]
def got(signum, frame):
    with open(os.path.join(out, "got" + os.environ["RANK"]), "w") as f:
        f.write(signal.Signals(signum).name + " " + os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"])
    sys.exit(0)
signal.signal(signal.SIGUSR1, got)
open(os.path.join(out, "ready" + os.environ["RANK"]), "w").close()
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    time.sleep(0.05)
"""


def test_a_listed_signal_is_forwarded_to_the_workers(tmp_path: Path) -> None:
    (tmp_path / "worker.py").write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RALLYPOINT_", "TORCHELASTIC_"))}
    argv = [*CLI, "run", "--nproc_per_node", "2", "--signals_to_handle", "SIGTERM,SIGUSR1", "--shutdown_timeout",
            "20", "--max_restarts", "0", "worker.py", str(tmp_path)]  # fmt: skip
    agent = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready{r}").exists() for r in (0, 1)):
            assert agent.poll() is None, agent.communicate()[0]
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.05)
        agent.send_signal(signal.SIGUSR1)
        output, _ = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert agent.returncode == 128 + signal.SIGUSR1, output
    for rank in (0, 1):
        assert (tmp_path / f"got{rank}").read_text() == "SIGUSR1 SIGTERM,SIGUSR1"
