"""Use any rallypoint rendezvous backend from torch's own agent (``torchrun --rdzv-backend ...``).

This module imports torch; nothing else in :mod:`rallypoint.rendezvous` does. Backend plugins
expose a ``torchrun.handlers`` entry point whose object, called with no arguments, returns a
creator ``(torch RendezvousParameters) -> torch RendezvousHandler``; :func:`torch_handler_creator`
builds such a creator from a ``(run_id, params) -> backend`` function.

Mapping:

* ``next_rendezvous`` returns a ``RendezvousInfo`` whose store is a :class:`BackendStore`
  (a ``torch.distributed.Store`` over the backend, prefixed per round) and whose bootstrap
  info is the round's ``MASTER_ADDR``/``MASTER_PORT`` (group rank 0's node, port chosen at
  run time). ``use_agent_store`` is False: worker rank 0 hosts the workers' TCPStore.
* ``--rdzv-conf`` keys: ``join_timeout``, ``last_call_timeout``, ``close_timeout``,
  ``heartbeat_interval`` (or torch's ``keep_alive_interval``), ``heartbeat_timeout``; durations
  (``30``, ``30s``, ``5m``), defaults those of :class:`~rallypoint.rendezvous.timeouts.RendezvousTimeouts`.
  They do not come from a job file, so they are validated here
  (:meth:`~rallypoint.rendezvous.timeouts.RendezvousTimeouts.from_options`); so are a backend's
  own settings, by the ``(run_id, params) -> backend`` function the plugin passes in.
* ``shutdown`` closes the rendezvous, as torch's own handlers do.
"""

from __future__ import annotations

import base64
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import api as torch_api

from rallypoint.rendezvous.backend import RendezvousBackend
from rallypoint.rendezvous.errors import RendezvousClosedError, RendezvousError, RendezvousTimeoutError
from rallypoint.rendezvous.handler import RendezvousHandler
from rallypoint.rendezvous.state import NodeInfo
from rallypoint.rendezvous.timeouts import RendezvousTimeouts

__all__ = ["BackendStore", "TorchRendezvousHandler", "torch_handler_creator"]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii")


def _bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class BackendStore(dist.Store):  # type: ignore[misc,name-defined]
    """A ``torch.distributed.Store`` over a rallypoint backend.

    Keys are encoded (base64) under ``prefix``; values are stored as base64 text in JSON, never
    pickled. Implements ``set``, ``get`` (blocking), ``add``, ``compare_set``, ``wait``,
    ``check``, ``delete_key``, ``num_keys`` and ``set_timeout``; ``multi_get``/``multi_set``
    come from the base class.
    """

    def __init__(self, backend: RendezvousBackend, prefix: str, timeout: float = 300.0) -> None:
        super().__init__()
        self._backend = backend
        self._prefix = prefix.rstrip("/") + "/"
        self._timeout = timeout

    def _key(self, key: str) -> str:
        return self._prefix + _b64(key.encode()).replace("=", "")

    def set_timeout(self, timeout: timedelta) -> None:
        """Default timeout of blocking calls."""
        self._timeout = timeout.total_seconds()

    def set(self, key: str, value: Any) -> None:
        """Store ``value`` (bytes or str)."""
        self._backend.set(self._key(key), {"b": _b64(_bytes(value))})

    def _read(self, key: str) -> bytes | None:
        entry = self._backend.get(self._key(key))
        if entry is None:
            return None
        return base64.urlsafe_b64decode(entry.value["b"])

    def get(self, key: str) -> bytes:
        """The value of ``key``, waiting for it up to the timeout."""
        self.wait([key])
        value = self._read(key)
        if value is None:  # deleted in between
            raise dist.DistStoreError(f"key {key!r} vanished from the rendezvous store")
        return value

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the integer text under ``key``."""
        k = self._key(key)
        while True:
            entry = self._backend.get(k)
            current = 0 if entry is None else int(base64.urlsafe_b64decode(entry.value["b"]) or b"0")
            total = current + int(amount)
            ok, _ = self._backend.compare_and_set(
                k, {"b": _b64(str(total).encode())}, version=None if entry is None else entry.version
            )
            if ok:
                return total

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        """Set ``desired`` if the value is ``expected`` (or absent and ``expected`` is empty)."""
        k = self._key(key)
        exp, des = _bytes(expected), _bytes(desired)
        while True:
            entry = self._backend.get(k)
            current = None if entry is None else base64.urlsafe_b64decode(entry.value["b"])
            if (current is None and exp == b"") or (current is not None and current == exp):
                ok, _ = self._backend.compare_and_set(
                    k, {"b": _b64(des)}, version=None if entry is None else entry.version
                )
                if ok:
                    return des
                continue
            return exp if current is None else current

    def check(self, keys: list[str]) -> bool:
        """Whether every key exists."""
        return all(self._backend.get(self._key(k)) is not None for k in keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        """Block until every key exists."""
        limit = self._timeout if timeout is None else timeout.total_seconds()
        deadline = time.monotonic() + limit
        for key in keys:
            k = self._key(key)
            while self._backend.get(k) is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise dist.DistStoreError(f"timed out after {limit:g}s waiting for store key {key!r}")
                self._backend.watch(k, version=None, timeout=remaining)

    def delete_key(self, key: str) -> bool:
        """Delete ``key``."""
        return self._backend.delete(self._key(key))

    def num_keys(self) -> int:
        """Number of keys under this store's prefix."""
        return len(self._backend.list(self._prefix))


class TorchRendezvousHandler(torch_api.RendezvousHandler):
    """torch's ``RendezvousHandler`` interface over a rallypoint :class:`RendezvousHandler`."""

    def __init__(self, handler: RendezvousHandler, backend_name: str) -> None:
        self._handler = handler
        self._name = backend_name

    def get_backend(self) -> str:
        """The name torch knows this backend by."""
        return self._name

    @property
    def use_agent_store(self) -> bool:
        """Workers use their own TCPStore hosted by worker rank 0."""
        return False

    def next_rendezvous(self) -> torch_api.RendezvousInfo:
        """Run a rallypoint round and translate the result for torch's agent."""
        try:
            result = self._handler.next_rendezvous()
        except RendezvousClosedError as exc:
            raise torch_api.RendezvousClosedError(str(exc)) from exc
        except RendezvousTimeoutError as exc:
            raise torch_api.RendezvousTimeoutError(str(exc)) from exc
        except RendezvousError as exc:
            raise torch_api.RendezvousStateError(str(exc)) from exc
        store = BackendStore(self._handler.backend, f"torch/{result.round}")
        info = torch_api.RendezvousStoreInfo(result.store.master_addr, result.store.master_port)
        return torch_api.RendezvousInfo(store, result.group_rank, result.num_nodes, info)

    def is_closed(self) -> bool:
        """Whether the job is over."""
        return self._handler.is_closed()

    def set_closed(self) -> None:
        """Close the rendezvous."""
        self._handler.set_closed()

    def num_nodes_waiting(self) -> int:
        """Nodes waiting, or 1 when the running round is over (a peer left or died)."""
        return self._handler.num_nodes_waiting()

    def get_run_id(self) -> str:
        """The run id."""
        return self._handler.run_id

    def shutdown(self) -> bool:
        """Stop heartbeats and close the rendezvous (torch's semantics)."""
        return self._handler.shutdown(close=True)


def _timeouts(params: Any) -> RendezvousTimeouts:
    """The timeouts of torch's ``--rdzv-conf`` (validated here: no job file vouched for them)."""
    return RendezvousTimeouts.from_options(params.get, where="--rdzv-conf")


def torch_handler_creator(
    name: str, open_backend: Callable[[str, Any], RendezvousBackend]
) -> Callable[[Any], TorchRendezvousHandler]:
    """A torch handler creator for a backend.

    Args:
        name: the torch backend name (``rallypoint-file``).
        open_backend: ``(run_id, torch RendezvousParameters) -> backend``.
    """

    def create(params: Any) -> TorchRendezvousHandler:
        host = socket.getfqdn()
        addr = params.local_addr or host
        node = NodeInfo(node_id=f"{host}-{os.getpid()}".replace("/", "-"), host=host, addr=addr)
        handler = RendezvousHandler(
            open_backend(params.run_id, params),
            node,
            min_nodes=params.min_nodes,
            max_nodes=params.max_nodes,
            timeouts=_timeouts(params),
            owns_backend=True,
        )
        return TorchRendezvousHandler(handler, name)

    return create
