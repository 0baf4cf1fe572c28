"""Server scale: N simulated nodes complete one rendezvous round against one gRPC rendezvous server.

The server is a ``rallypoint rdzv serve`` process (asyncio, one event loop). The nodes are real
``RendezvousHandler`` objects of the ``grpc`` backend, many per process: ``--procs`` client
processes with N / procs threads each (threads, not asyncio: the handler is synchronous), every
process sharing one channel. Handlers are built before the clock starts; all client processes
are released together through one pipe. The time is release to the last ``next_rendezvous()``
return; every node's result is checked (group ranks a permutation of 0..N-1, one round, world N).
The server's CPU time (user + system, from /proc) during the round, its resident memory before
and after and its peak are reported, and the client processes' CPU time during the round.

The handlers of one client process share the process's roster cache
(:mod:`rallypoint.rendezvous.roster`): the round's membership record is fetched and parsed once
per process, not once per handler. Every other call (check-in, ticket, join record, join count,
the header watch, the read after it) is made by every handler, as separate nodes would.

``--floor CALLS`` makes no round: each simulated node makes CALLS bare ``Get`` calls and returns,
through the backend's own client in threads (as above) or, with ``--floor-client aio``, through
bare ``grpc.aio`` stubs in asyncio tasks (no handler, no retry, no JSON: grpcio's own cost). It
shows what the calls alone cost this machine, before any rendezvous protocol.

Run from the repository root:

    .venv/bin/python tools/bench/grpc_server_scale.py --nodes 4096 --procs 8
    .venv/bin/python tools/bench/grpc_server_scale.py --nodes 4096 --procs 16 --floor 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tools.bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench.harness import format_duration

RALLYPOINT = str(Path(sys.executable).with_name("rallypoint"))
TIMEOUT = 600.0


def _worker(argv: list[str]) -> int:
    """One client process: ``count`` handlers from ``first``, in threads; prints one JSON line."""
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", required=True)
    p.add_argument("--first", type=int, required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--start-fd", type=int, required=True)
    p.add_argument("--floor", type=int, default=0)
    p.add_argument("--floor-client", choices=("threads", "aio"), default="threads")
    a = p.parse_args(argv)
    if a.floor and a.floor_client == "aio":
        return _aio_floor(a)

    from rallypoint.rendezvous.handler import RendezvousHandler
    from rallypoint.rendezvous.state import NodeInfo
    from rallypoint.rendezvous.timeouts import RendezvousTimeouts
    from rallypoint_grpc.backend import GrpcBackend

    timeouts = RendezvousTimeouts(
        join=TIMEOUT, last_call=5.0, close=60.0, heartbeat_interval=60.0, heartbeat_timeout=TIMEOUT
    )
    handlers = [
        RendezvousHandler(
            GrpcBackend(a.endpoint, "scale", call_timeout=TIMEOUT, retry_timeout=30.0),
            NodeInfo(node_id=f"node{i:05d}", host=f"host{i}", addr="127.0.0.1", master_port=20000 + i % 40000),
            min_nodes=a.nodes,
            max_nodes=a.nodes,
            timeouts=timeouts,
        )
        for i in range(a.first, a.first + a.count)
    ]
    out: list[dict[str, object]] = []
    lock = threading.Lock()

    def node(index: int, h: RendezvousHandler) -> None:
        try:
            if a.floor:  # no protocol: the node's bare calls, through the same client
                for _ in range(a.floor):
                    h.backend.get("floor")
                item: dict[str, object] = {"t": time.monotonic(), "rank": index, "round": 0, "n": a.nodes}
            else:
                r = h.next_rendezvous()
                item = {"t": time.monotonic(), "rank": r.group_rank, "round": r.round, "n": r.num_nodes}
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            item = {"error": f"{type(exc).__name__}: {exc}"}
        with lock:
            out.append(item)

    threads = [threading.Thread(target=node, args=(a.first + i, h), daemon=True) for i, h in enumerate(handlers)]
    print("ready", flush=True)
    os.read(a.start_fd, 1)
    cpu = time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    print(json.dumps({"cpu": time.process_time() - cpu, "nodes": out}), flush=True)
    os._exit(0)


def _aio_floor(a: argparse.Namespace) -> int:
    """``--floor`` with ``--floor-client aio``: ``count`` asyncio tasks, each making ``floor`` bare
    ``Get`` calls on one ``grpc.aio`` channel (no handler, no retry, no JSON): grpcio's own floor."""
    import asyncio

    import grpc

    from rallypoint_grpc._proto import rendezvous_pb2 as pb
    from rallypoint_grpc._proto import rendezvous_pb2_grpc as pb_grpc

    async def run() -> None:
        async with grpc.aio.insecure_channel(a.endpoint) as channel:
            stub = pb_grpc.RendezvousStub(channel)  # type: ignore[no-untyped-call]
            await stub.Get(pb.GetRequest(space="scale", key="floor"), timeout=TIMEOUT)  # connected before the clock
            print("ready", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, os.read, a.start_fd, 1)
            out: list[dict[str, object]] = []

            async def node(index: int) -> None:
                try:
                    for _ in range(a.floor):
                        await stub.Get(pb.GetRequest(space="scale", key="floor"), timeout=TIMEOUT)
                    out.append({"t": time.monotonic(), "rank": index, "round": 0, "n": a.nodes})
                except grpc.aio.AioRpcError as exc:  # reported to the parent, as the threads' failures
                    out.append({"error": f"{exc.code().name}: {exc.details()}"})

            cpu = time.process_time()
            await asyncio.gather(*(node(i) for i in range(a.first, a.first + a.count)))
            print(json.dumps({"cpu": time.process_time() - cpu, "nodes": out}), flush=True)

    asyncio.run(run())
    os._exit(0)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _memory_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    """Start the server and the client processes, release them, check and report."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=4096)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument(
        "--floor",
        type=int,
        default=0,
        metavar="CALLS",
        help="instead of a round, each simulated node makes CALLS bare Get calls and returns: the least a "
        "node's calls cost, with no rendezvous protocol (0: a real round, the default)",
    )
    parser.add_argument(
        "--floor-client",
        choices=("threads", "aio"),
        default="threads",
        help="--floor's clients: the grpc backend's own client in threads (as a real round), or bare "
        "grpc.aio stubs in asyncio tasks (grpcio's own floor)",
    )
    args = parser.parse_args(argv)
    if args.floor < 0:
        parser.error(f"--floor wants a count >= 0, got {args.floor}")
    if args.floor_client != "threads" and not args.floor:
        parser.error("--floor-client applies to --floor runs only")
    server = subprocess.Popen(
        [RALLYPOINT, "rdzv", "serve", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert server.stdout is not None
    endpoint = server.stdout.readline().split("serving on ")[1].split()[0]
    start_r, start_w = os.pipe()
    per = -(-args.nodes // args.procs)
    clients = []
    try:
        for first in range(0, args.nodes, per):
            count = min(per, args.nodes - first)
            cmd = [sys.executable, __file__, "--worker", "--endpoint", endpoint, "--first", str(first)]
            cmd += ["--count", str(count), "--nodes", str(args.nodes), "--start-fd", str(start_r)]
            cmd += ["--floor", str(args.floor), "--floor-client", args.floor_client]
            clients.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, pass_fds=(start_r,)))
        os.close(start_r)
        for c in clients:
            assert c.stdout is not None
            line = c.stdout.readline().strip()
            if line != "ready":
                raise SystemExit(f"a client process failed to start: {line!r}")
        cpu0, rss0 = _cpu_seconds(server.pid), _memory_mib(server.pid, "VmRSS")
        released = time.monotonic()
        os.close(start_w)
        results, client_cpu = [], 0.0
        for c in clients:
            assert c.stdout is not None
            line = c.stdout.readline()
            if not line.strip():
                raise SystemExit(f"a client process (pid {c.pid}) exited without its report; see its stderr above")
            report = json.loads(line)
            results.extend(report["nodes"])
            client_cpu += report["cpu"]
        cpu1 = _cpu_seconds(server.pid)
        peak, rss1 = _memory_mib(server.pid, "VmHWM"), _memory_mib(server.pid, "VmRSS")
    finally:
        for c in clients:
            c.kill()
        server.kill()
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise SystemExit(f"{len(errors)} node(s) failed, e.g. {errors[0]}")
    ranks = sorted(r["rank"] for r in results)
    if ranks != list(range(args.nodes)) or len({r["round"] for r in results}) != 1:
        raise SystemExit(f"wrong result: {len(results)} nodes, rounds {sorted({r['round'] for r in results})}")
    elapsed = max(r["t"] for r in results) - released
    kind = "asyncio tasks" if args.floor and args.floor_client == "aio" else "threads"
    print(f"grpc server scale: {args.nodes} nodes ({args.procs} client processes x {per} {kind}, one channel each)")
    if args.floor:
        print(f"floor: {args.floor} bare Get call(s) per node, no rendezvous protocol ({args.floor_client} clients)")
        print(f"release to the last node's last call: {format_duration(elapsed)}")
    else:
        print(f"one round, release to last next_rendezvous() return: {format_duration(elapsed)}")
    print(f"server CPU during the round: {cpu1 - cpu0:.2f} s (user + system)")
    print(f"client processes' CPU during the round: {client_cpu:.2f} s in all")
    print(f"server memory: {rss0:.0f} MiB before the round, {rss1:.0f} MiB after, peak {peak:.0f} MiB")
    return 0


if __name__ == "__main__":
    if "--worker" in sys.argv[1:]:
        sys.exit(_worker([a for a in sys.argv[1:] if a != "--worker"]))
    sys.exit(main())
