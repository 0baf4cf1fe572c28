"""A corrupted heartbeat record stops every node at once, naming the node (two agents, file backend).

Before: the node that read the corrupt record (a file that is not JSON) failed alone with exit 1;
the other left the round, re-rendezvoused and waited the whole join timeout for it.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from test_run import RALLYPOINT, agent_env, file_job, script

#: A worker that runs until its agent stops it; its start is marked by a file.
WORKER = """
import os, sys, time
open(os.path.join(sys.argv[1], f"started-{os.environ['RANK']}"), "w").close()
time.sleep(600)
"""
JOIN_TIMEOUT = 120  # a node left waiting for the join timeout would outlast the test's deadline
DEADLINE = 60


def test_a_corrupt_heartbeat_record_fails_every_node_at_once(tmp_path: Path) -> None:
    body = script(tmp_path, "worker.py", WORKER)
    args = file_job(
        tmp_path,
        "corrupt-hb",
        "2",
        "--set",
        f'rendezvous.join_timeout="{JOIN_TIMEOUT}s"',
        "--set",
        'rendezvous.heartbeat_interval="0.25s"',
        "--set",
        'rendezvous.heartbeat_timeout="5s"',
        "--max-restarts",
        "0",
    )
    agents = {
        node: subprocess.Popen(
            [*RALLYPOINT, *args, "--node-id", node, str(body), str(tmp_path)],
            cwd=tmp_path,
            env=agent_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in ("A", "B")
    }
    try:
        deadline = time.monotonic() + DEADLINE
        record = tmp_path / "rdzv" / "corrupt-hb" / "kv" / "hb" / "B"
        while not record.exists() or not all((tmp_path / f"started-{rank}").exists() for rank in (0, 1)):
            assert time.monotonic() < deadline, "the workers did not start, or B never beat"
            assert all(a.poll() is None for a in agents.values()), "an agent exited before its worker started"
            time.sleep(0.05)
        while any(a.poll() is None for a in agents.values()):  # B rewrites its record every beat: keep at it
            assert time.monotonic() < deadline, "a node still runs: it waits for the join timeout"
            record.write_text("garbage{")
            time.sleep(0.05)
        outputs = {node: a.communicate(timeout=30) for node, a in agents.items()}
    finally:
        for agent in agents.values():
            if agent.poll() is None:
                agent.kill()
                agent.communicate(timeout=30)
    for node, agent in agents.items():
        out, err = outputs[node]
        assert agent.returncode == 1, (node, out, err)
        assert "the heartbeat record of node 'B' (hb/B) is corrupt" in out + err, (node, out, err)
        assert "Traceback" not in err, (node, err)
