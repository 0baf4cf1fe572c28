"""Each side of an RPC benchmark in processes of its own: a caller the parent drives and a callee.

Two RPC systems in one process change each other's behaviour (threads of one run tensor
operations and change how the process's idle OpenMP threads wait; a polling transport takes CPU
from the other side's calls), so the RPC benchmarks give each side a caller and a callee process
of its own and time the sides alternately from a parent that only conducts.

The caller is the benchmark script itself, started with the arguments it is given, and speaks a
line protocol on its stdin and stdout: it prints one line when it is ready, then answers each
command line with one JSON line; ``quit`` (or the end of its stdin) makes it leave.

This module must stay light (no torch): the parent imports it.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tools.bench.harness import BenchmarkError

__all__ = ["REPLY_LIMIT", "SideProcesses", "alone", "free_port", "join_group"]

#: Seconds a caller may take to start, or to answer one command.
REPLY_LIMIT = 300.0


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for a group's store)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SideProcesses:
    """One side's caller and callee processes, driven through the caller's stdin and stdout.

    Args:
        label: the side's name, for errors.
        caller: the caller's argv; callee: the callee's argv.
        env: extra environment variables of both.
    """

    def __init__(self, label: str, caller: Sequence[str], callee: Sequence[str], env: Mapping[str, str]) -> None:
        self.label = label
        full = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
        self.callee = subprocess.Popen(list(callee), env=full)
        self.caller = subprocess.Popen(list(caller), env=full, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._buffer = ""

    def read(self, what: str) -> str:
        """The caller's next line (raises when it exits first, or stays silent past :data:`REPLY_LIMIT`)."""
        assert self.caller.stdout is not None
        deadline = time.monotonic() + REPLY_LIMIT
        while "\n" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.caller.stdout], [], [], max(0.0, min(left, 1.0)))
            if ready:
                chunk = os.read(self.caller.stdout.fileno(), 1 << 20).decode()
                if not chunk:
                    raise BenchmarkError(f"{self.label}'s caller exited before it could {what} (its stderr is above)")
                self._buffer += chunk
            elif left <= 0:
                raise BenchmarkError(f"{self.label}'s caller did not {what} within {REPLY_LIMIT:g}s")
        line, _, self._buffer = self._buffer.partition("\n")
        return line

    def ask(self, command: str, what: str) -> Any:
        """Send one command line; returns the caller's JSON answer."""
        assert self.caller.stdin is not None
        self.caller.stdin.write(command + "\n")
        self.caller.stdin.flush()
        return json.loads(self.read(what))

    def close(self) -> bool:
        """Ask the caller to leave and wait for both processes; ``True`` when both ended well."""
        failed = False
        if self.caller.poll() is None and self.caller.stdin is not None:
            try:
                self.caller.stdin.write("quit\n")
                self.caller.stdin.close()
            except OSError:
                failed = True
        for proc in (self.caller, self.callee):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            failed = failed or proc.returncode != 0
        return not failed


def alone(side: str) -> bool:
    """Whether only ``side``'s RPC system (``"rallypoint"`` or ``"torch"``) runs in this process.

    For the callers to check themselves (it imports torch's RPC module, as torch does anyway).
    """
    import sys

    if side == "torch":
        return "rallypoint.rpc" not in sys.modules
    from torch.distributed.rpc import api as torch_rpc_api

    return not torch_rpc_api._is_current_rpc_agent_set()


def join_group(side: str, rank: int, port: int, path: str, exposed: Callable[..., Any]) -> Any:
    """Join ``side``'s two-process RPC group as ``w<rank>`` (its store on 127.0.0.1:``port``).

    ``path``: ``"tcp"`` (TensorPipe's uv transport; rallypoint's same-host path off) or ``"shm"``
    (TensorPipe's shm transport with cma; rallypoint's default same-host path). ``exposed``: the
    function the callee runs (rallypoint exposes it). Returns the RPC module to call and shut down
    with. Imports torch: for the callers and callees only.
    """
    if side == "torch":
        import warnings

        import torch.distributed.rpc as trpc

        warnings.filterwarnings("ignore", category=UserWarning, module="torch")  # its RPC's deprecation notes
        links = {"tcp": (["uv"], ["basic"]), "shm": (["shm"], ["cma", "basic"])}[path]
        opts = trpc.TensorPipeRpcBackendOptions(
            init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=120, _transports=links[0], _channels=links[1]
        )
        trpc.init_rpc(f"w{rank}", rank=rank, world_size=2, rpc_backend_options=opts)  # type: ignore[no-untyped-call]
        return trpc
    from rallypoint import rpc

    rpc.expose(exposed)
    rp_opts = rpc.RpcOptions(
        init_method=f"tcp://127.0.0.1:{port}",
        rpc_timeout=120,
        host="127.0.0.1",
        transport_options={"same_host_shm": path == "shm"},
    )
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2, options=rp_opts)
    return rpc
