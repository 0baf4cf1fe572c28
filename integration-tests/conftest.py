"""Fixtures of the integration tests: namespace hosts (see ``netns.py``), the DDP reference run."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import netns


def _terminate_as_interrupt(signum: int, frame: Any) -> None:
    """SIGTERM (a CI job cancelled, ``timeout``) ends the run like Ctrl-C: fixtures tear down."""
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture
def hosts() -> Iterator[Callable[..., netns.HostNetwork]]:
    """Make namespace hosts: ``net = hosts(2)``; torn down after the test, which checks it.

    Torn down when the test passes, fails or is interrupted (Ctrl-C, or SIGTERM, which this
    fixture turns into Ctrl-C while it holds hosts); hosts left by a run killed with SIGKILL are
    swept at the start of the next one. After the teardown the test fails if a namespace, an
    ``/etc/netns`` entry or a process of the hosts is left.

    Where namespaces cannot be created the test fails with the reason: CI runs as root, so a
    missing privilege is a broken CI machine, not something to skip.
    """
    netns.sweep_stale()
    made: list[netns.HostNetwork] = []
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminate_as_interrupt)

    def make(count: int, **kwargs: Any) -> netns.HostNetwork:
        try:
            network = netns.HostNetwork(count, **kwargs)
        except netns.NetnsUnavailable as exc:
            pytest.fail(f"cannot create namespace hosts: {exc}")
        made.append(network)
        return network

    try:
        yield make
    finally:
        killed: set[int] = set()
        for network in made:
            killed |= network.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    left = netns.leftovers(os.getpid())
    assert not left, f"namespace hosts left behind: {left}"
    alive = sorted(pid for pid in killed if netns.process_alive(pid))
    assert not alive, f"processes of the namespace hosts still running after teardown: {alive}"


@pytest.fixture
def slurm() -> Iterator[Callable[..., Any]]:
    """Make a Slurm cluster on namespace hosts: ``cluster = slurm(3)`` (see ``slurm_cluster.py``).

    Torn down after the test whatever happened (SIGTERM too, as for ``hosts``); the test then
    fails if a namespace, a daemon, a job process or the cluster's folder is left. Where Slurm is
    not installed the test fails with the ``apt-get`` line to run: CI installs it (``.ci/run``).
    """
    import slurm_cluster

    netns.sweep_stale()
    made: list[slurm_cluster.SlurmCluster] = []
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminate_as_interrupt)

    def make(compute: int = 3) -> slurm_cluster.SlurmCluster:
        try:
            cluster = slurm_cluster.SlurmCluster(compute)
        except (slurm_cluster.SlurmUnavailable, netns.NetnsUnavailable) as exc:
            pytest.fail(f"cannot start the Slurm cluster: {exc}")
        made.append(cluster)
        return cluster

    try:
        yield make
    finally:
        killed: set[int] = set()
        for cluster in made:
            killed |= cluster.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    left = netns.leftovers(os.getpid()) + [str(c.root) for c in made if c.root.exists()]
    assert not left, f"Slurm cluster left behind: {left}"
    alive = sorted(pid for pid in killed if netns.process_alive(pid))
    assert not alive, f"processes of the Slurm cluster still running after teardown: {alive}"


@pytest.fixture(scope="session")
def ddp_reference(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """The final weights of ``examples/ddp/train.py`` run as one plain process (the reference)."""
    import fcntl
    import json

    import ddp_jobs

    # computed once per test run: pytest-xdist's workers share the directory above their own
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "ddp-reference"
    shared.mkdir(exist_ok=True)
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = shared / "out" / "final.json"
        if not done.exists():
            ddp_jobs.reference_weights(shared / "out")
        return list(json.loads(done.read_text()))
