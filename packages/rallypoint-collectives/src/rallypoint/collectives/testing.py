# ruff: noqa: D102  (the test methods are named for what they check)
"""The collective-backend conformance kit: a reusable pytest suite every backend runs against itself.

Usage, in a backend plugin's test module (the plugin installed, so that its record is registered)::

    import pytest
    from rallypoint.collectives.testing import CollectiveBackendConformance

    class TestMyBackend(CollectiveBackendConformance):
        @pytest.fixture
        def backend_name(self):
            return "my-backend"

        @pytest.fixture  # optional: the [collectives.options] table, as a job file gives it
        def options(self):
            return {"announce": True}

The kit checks the registered record (its class, device, torch name, timeouts), that looking the
backend up imports no torch (the agent and the CLI build the same registry), that its
availability check answers with a reason, that its options validate, and then starts
``world_size`` real worker processes (``spawn``) that initialise the backend through
:func:`rallypoint.collectives.init` and run ``all_reduce``, ``broadcast``, ``all_gather`` and
``barrier`` through the facade, checking every result. A CUDA backend on a machine without a
usable GPU skips the process test with the availability check's reason; a CPU backend that says
it is unavailable fails it.
"""

from __future__ import annotations

import json
import multiprocessing
import queue
import socket
import subprocess
import sys
import time
from typing import Any

import pytest

from rallypoint.collectives.records import COLLECTIVE_BACKENDS, Availability, CollectiveBackendRecord

__all__ = ["CollectiveBackendConformance", "run_collectives"]

#: Seconds the worker processes get to start torch, initialise and finish.
DEADLINE = 180.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run_collectives(backend: str, rank: int, world_size: int, port: int, options: str, out: Any) -> None:
    """One worker of the process test (module level: ``spawn`` imports it by name).

    Puts ``(rank, results)`` on ``out``, or ``(rank, "error: ...")`` when something raised.
    """
    try:
        import torch

        from rallypoint import collectives

        environ = {
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RALLYPOINT_COLLECTIVES_OPTIONS": options,
        }
        info = collectives.init(
            backend,
            timeout=60,
            rank=rank,
            world_size=world_size,
            master_addr="127.0.0.1",
            master_port=port,
            environ=environ,
        )
        device = torch.device("cuda", torch.cuda.current_device()) if info.device == "cuda" else torch.device("cpu")
        total = torch.tensor([float(rank + 1)], device=device)
        collectives.all_reduce(total)
        value = torch.tensor([float(rank * 10)], device=device)
        collectives.broadcast(value, src=world_size - 1)
        gathered = [torch.zeros(1, device=device) for _ in range(world_size)]
        collectives.all_gather(gathered, torch.tensor([float(rank)], device=device))
        collectives.barrier()
        results = {
            "backend": info.backend,
            "rank": info.rank,
            "all_reduce": total.item(),
            "broadcast": value.item(),
            "all_gather": [t.item() for t in gathered],
        }
        collectives.destroy()
        out.put((rank, results))
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        out.put((rank, f"error: {type(exc).__name__}: {exc}"))


class CollectiveBackendConformance:
    """Subclass it and provide a ``backend_name`` fixture (and ``options`` if the backend takes any)."""

    #: How many worker processes the process test starts.
    world_size: int = 2

    @pytest.fixture
    def backend_name(self) -> str:
        raise NotImplementedError("override the 'backend_name' fixture: return the registered backend's name")

    @pytest.fixture
    def options(self) -> dict[str, Any] | None:
        return None

    @pytest.fixture
    def record(self, backend_name: str) -> CollectiveBackendRecord:
        from rallypoint.core.plugins import get_plugin_manager

        return get_plugin_manager().registry(COLLECTIVE_BACKENDS).get(backend_name)

    def test_the_record_is_well_formed(self, record: CollectiveBackendRecord) -> None:
        assert isinstance(record, CollectiveBackendRecord)
        assert record.device in ("cpu", "cuda")
        assert record.torch_name, "torch_backend (or the name) must name a torch.distributed backend"
        assert record.default_timeout is None or record.default_timeout > 0
        assert record.summary, "give the record a one-line summary (rallypoint plugins list shows it)"

    def test_looking_the_backend_up_imports_no_torch(self, backend_name: str) -> None:
        probe = (
            "import sys\n"
            "from rallypoint.core.plugins import get_plugin_manager\n"
            "from rallypoint.collectives.records import COLLECTIVE_BACKENDS\n"
            f"get_plugin_manager().registry(COLLECTIVE_BACKENDS).get({backend_name!r})\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
        )
        result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "[]", "the hook module or the record imports torch: " + result.stdout

    def test_availability_answers_with_a_reason(self, record: CollectiveBackendRecord) -> None:
        answer = record.check_availability()
        assert isinstance(answer, Availability)
        assert isinstance(answer.reason, str)
        assert answer.reason.strip()

    def test_options_validate(self, record: CollectiveBackendRecord, options: dict[str, Any] | None) -> None:
        if record.options_model is None:
            assert not options, "the record has no options_model, so it takes no [collectives.options]"
            return
        record.options_model.model_validate(options or {})

    def test_collectives_across_processes(
        self, record: CollectiveBackendRecord, backend_name: str, options: dict[str, Any] | None
    ) -> None:
        answer = record.check_availability()
        if not answer.available:
            if record.device == "cuda":
                pytest.skip(f"{backend_name} needs a GPU: {answer.reason}")
            pytest.fail(f"{backend_name} says it is unavailable on CPU: {answer.reason}")
        results = self._run(backend_name, options)
        n = self.world_size
        for rank in range(n):
            got = results[rank]
            assert isinstance(got, dict), f"rank {rank}: {got}"
            assert got["backend"] == record.name
            assert got["rank"] == rank
            assert got["all_reduce"] == n * (n + 1) / 2, f"rank {rank}: all_reduce"
            assert got["broadcast"] == (n - 1) * 10, f"rank {rank}: broadcast"
            assert got["all_gather"] == [float(r) for r in range(n)], f"rank {rank}: all_gather"

    def _run(self, backend_name: str, options: dict[str, Any] | None) -> dict[int, Any]:
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        port = _free_port()
        table = json.dumps(options or {})
        procs = [
            ctx.Process(target=run_collectives, args=(backend_name, r, self.world_size, port, table, out))
            for r in range(self.world_size)
        ]
        for p in procs:
            p.start()
        results: dict[int, Any] = {}
        deadline = time.monotonic() + DEADLINE
        try:
            while len(results) < self.world_size and time.monotonic() < deadline:
                try:
                    rank, got = out.get(timeout=1.0)
                except queue.Empty:
                    if all(p.exitcode is not None for p in procs) and out.empty():
                        break
                    continue
                results[rank] = got
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.exitcode is None:
                    p.kill()
        missing = sorted(set(range(self.world_size)) - set(results))
        assert not missing, (
            f"ranks {missing} gave no result within {DEADLINE:.0f}s (exit codes: "
            + str([p.exitcode for p in procs])
            + ")"
        )
        return results
