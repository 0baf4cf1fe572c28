"""The workers one attempt starts on this node: their environment and progress files (in-process)."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

from rallypoint.agent.ranks import RankNode, compute_assignment
from rallypoint.agent.settings import AgentSettings
from rallypoint.agent.worker_specs import DEBUG_DIR_ENV, attempt_workers
from rallypoint.core.config import PerWorker, ProgressFile
from rallypoint.rendezvous.handler import RendezvousHandler
from rallypoint.rendezvous.memory import MemoryBackend
from rallypoint.rendezvous.testing import make_node
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

FAST = RendezvousTimeouts(join=20, last_call=0.1, close=5, heartbeat_interval=0.1, heartbeat_timeout=1)


def test_each_worker_gets_its_own_filled_in_values_and_its_progress_files(tmp_path: Path) -> None:
    run_id = f"specs-{uuid.uuid4().hex[:8]}"
    handler = RendezvousHandler(
        MemoryBackend(run_id, shared=False), make_node(0, local_world_size=2), min_nodes=1, max_nodes=1, timeouts=FAST
    )
    result = handler.next_rendezvous()
    try:
        nodes = [
            RankNode(node_id=p.node_id, group_rank=i, host=p.host, local_world_size=p.local_world_size)
            for i, p in enumerate(result.participants)
        ]
        settings = AgentSettings(
            argv=[sys.executable, "-c", "pass"],
            run_id=run_id,
            host="h",
            log_dir=tmp_path,
            worker_env={
                "PLAIN": "same for all",
                "PER_RANK": PerWorker("r{rank}-l{local_rank}"),
                "EVENTS": ProgressFile("{attempt_dir}/events/rank_{rank}.jsonl"),
            },
        )
        attempt_dir = tmp_path / "attempt_0"
        (attempt_dir).mkdir()
        stale = attempt_dir / "rank_1.error.json"
        stale.write_text("{}")  # a previous attempt's error file is not this attempt's
        workers = attempt_workers(
            settings,
            result,
            compute_assignment(settings.strategy, nodes),
            attempt=0,
            attempt_dir=attempt_dir,
            host="h",
            watchdog_env=lambda rank: {"WATCHDOG": f"w{rank}"},
        )
    finally:
        handler.shutdown(close=True)
    assert [s.rank for s in workers.specs] == [0, 1]
    for spec in workers.specs:
        r = spec.rank
        assert spec.env["PLAIN"] == "same for all"
        assert spec.env["PER_RANK"] == f"r{r}-l{r}"
        assert spec.env["EVENTS"] == f"{attempt_dir}/events/rank_{r}.jsonl"
        assert spec.env["WATCHDOG"] == f"w{r}"
        assert spec.env[DEBUG_DIR_ENV] == str(attempt_dir / "debug")
        assert spec.env["RANK"] == str(r)
    # only the ProgressFile values are progress, for the hang watch
    assert workers.progress == {r: (attempt_dir / "events" / f"rank_{r}.jsonl",) for r in (0, 1)}
    assert {r: w.local_rank for r, w in workers.ranks.items()} == {0: 0, 1: 1}
    assert workers.store.endswith(f":{result.store_on(result.node.node_id).master_port}")
    assert not stale.exists()
