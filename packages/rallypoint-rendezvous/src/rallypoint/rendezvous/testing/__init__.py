"""The rendezvous conformance kit: reusable pytest suites every backend runs against itself.

Usage, in a backend's test module::

    import pytest
    from rallypoint.rendezvous.testing import (
        MultiProcessBackendConformance, MultiProcessHandlerConformance)

    class MyFactory:
        def __init__(self, root):
            self.root = root
        def __call__(self, run_id):  # a fresh client of the same space for every call
            return MyBackend(self.root, run_id)

    class TestMyBackend(MultiProcessBackendConformance):
        @pytest.fixture
        def backend_factory(self, tmp_path):
            return MyFactory(tmp_path)

    class TestMyHandler(MultiProcessHandlerConformance):
        @pytest.fixture
        def backend_factory(self, tmp_path):
            return MyFactory(tmp_path)

``backend_factory`` returns a callable ``run_id -> backend``; every call must return a new
client of the same space. Each test uses a fresh run id. An in-process backend uses
:class:`BackendConformance` and :class:`HandlerConformance` (threads only); a backend shared
between processes uses the ``MultiProcess`` variants, which add checks with real processes
started by a fork server (so the factory must be a small picklable object: an instance of a class
defined at module level, in the test module or its conftest, holding plain picklable state).
``forkserver`` rather than ``fork``: a test process that has started gRPC (an etcd or gRPC client,
or a server fixture) holds threads and locks that a plain ``fork`` would copy half-held, and the
children then hang; the fork server is a fresh interpreter that never started them.

The kit checks: basic reads and writes, JSON-only values, key validation, run-id scoping,
version tokens, compare-and-set and atomic add under races between threads and processes,
delete, prefix listing at scale, write ordering seen from another process, watch wake-ups and
timeouts, TTL expiry (when ``supports_ttl``), and the handler on top: N nodes join, a late node
waits, a node dies, close, join timeout, the assignment function's value reaching each member.
Writing many keys and waiting with more keys are checked on every backend (through the fallbacks
where it lacks them). A backend that offers the optional held watch adds
:class:`HeldWatchConformance` to its backend class; one that writes many keys in one call,
:class:`SetManyConformance`; one that sends more keys with a change, :class:`WaitWithConformance`.

For torch interop, :func:`run_torchrun_agents` starts real ``torchrun`` agents that meet through a
backend's ``--rdzv-backend rallypoint-<name>`` handler and run :data:`TORCHRUN_JOB` (a gloo
all_reduce), and :func:`assert_torch_registry_has` checks torch's handler registry lists it.

The kit's modules: :mod:`~rallypoint.rendezvous.testing.backend` (the key-value checks, and the
held watch's), :mod:`~rallypoint.rendezvous.testing.handler` (the handler checks),
:mod:`~rallypoint.rendezvous.testing.processes` (the fork server and what its children run),
:mod:`~rallypoint.rendezvous.testing.nodes` (test nodes and timeouts) and
:mod:`~rallypoint.rendezvous.testing.torchrun`.
"""

from rallypoint.rendezvous.testing.backend import (
    BackendConformance,
    HeldWatchConformance,
    MultiProcessBackendConformance,
    SetManyConformance,
    WaitWithConformance,
)
from rallypoint.rendezvous.testing.handler import HandlerConformance, MultiProcessHandlerConformance
from rallypoint.rendezvous.testing.nodes import FAST_TIMEOUTS, make_node
from rallypoint.rendezvous.testing.torchrun import TORCHRUN_JOB, assert_torch_registry_has, run_torchrun_agents

__all__ = [
    "FAST_TIMEOUTS",
    "BackendConformance",
    "HandlerConformance",
    "HeldWatchConformance",
    "MultiProcessBackendConformance",
    "MultiProcessHandlerConformance",
    "SetManyConformance",
    "WaitWithConformance",
    "TORCHRUN_JOB",
    "assert_torch_registry_has",
    "make_node",
    "run_torchrun_agents",
]
