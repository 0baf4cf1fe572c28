"""The agent's exit codes where signals meet rank computation (in-process, memory rendezvous)."""

from __future__ import annotations

import io
import os
import signal
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from rallypoint.agent.agent import ABORT_KEY, AgentSettings, ElasticAgent
from rallypoint.agent.ranks import RankAssignment, RankNode
from rallypoint.rendezvous.handler import RendezvousHandler
from rallypoint.rendezvous.memory import MemoryBackend
from rallypoint.rendezvous.state import HEADER_KEY, Header
from rallypoint.rendezvous.testing import make_node
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

FAST = RendezvousTimeouts(join=20, last_call=0.1, close=5, heartbeat_interval=0.1, heartbeat_timeout=1)


class SignalledWhileAssigning:
    """A rank strategy during which the agent receives ``signum`` (a scheduler's SIGTERM, a Ctrl-C)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.calls = 0

    def assign(self, nodes: Sequence[RankNode], options: Any) -> RankAssignment:
        self.calls += 1
        os.kill(os.getpid(), self.signum)  # the agent's handler runs as soon as this returns
        raise AssertionError("the signal did not interrupt the rank computation")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_during_rank_computation_exits_128_plus_n(tmp_path: Path, signum: int) -> None:
    run_id = f"sig-{uuid.uuid4().hex[:8]}"
    backend = MemoryBackend(run_id, shared=False)
    handler = RendezvousHandler(backend, make_node(0), min_nodes=1, max_nodes=1, timeouts=FAST)
    strategy = SignalledWhileAssigning(signum)
    settings = AgentSettings(
        argv=[sys.executable, "-c", "raise SystemExit('no worker may start')"],
        run_id=run_id,
        host="testhost",
        log_dir=tmp_path,
        strategy=strategy,
        stop_grace=1,
    )
    console = io.StringIO()
    result = ElasticAgent(handler, settings, console=console).run()
    assert strategy.calls == 1
    assert result.exit_code == 128 + signum, console.getvalue()
    # a signal to one node is not a rank-assignment error: the job is not ended for the others
    assert backend.get(ABORT_KEY) is None
    header = backend.get(HEADER_KEY)
    assert header is not None
    assert not Header.from_json(header.value).closed
    assert not list(tmp_path.glob("attempt_*/rank_*.log")), "a worker started"
