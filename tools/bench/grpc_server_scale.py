"""Server scale: N simulated nodes complete one rendezvous round against one gRPC rendezvous server.

The server is a ``rallypoint rdzv serve`` process (asyncio, one event loop). The nodes are real
``RendezvousHandler`` objects of the ``grpc`` backend, many per process: ``--procs`` client
processes with N / procs threads each (threads, not asyncio: the handler is synchronous), every
process sharing one channel. Handlers are built before the clock starts; all client processes
are released together through one pipe. The time is release to the last ``next_rendezvous()``
return; every node's result is checked (group ranks a permutation of 0..N-1, one round, world N).
The server's CPU time (user + system, from /proc) during the round, its resident memory before
and after and its peak are reported, and the client processes' CPU time during the round.

Each handler is given the agent's assignment function (``--no-assign``: none), as ``rallypoint
run`` does: the node that completes the round runs the rank strategy once and writes every
member's seat (its ranks, the world size, the store) with the roster in one call; every other
node receives its own seat with the header change that wakes it and decodes its share of the
ranks (:mod:`rallypoint.agent.node_share`). No handler reads the roster. Every call (check-in,
join record and count, the header watch) is made by every handler, as separate nodes would, each
handler on its own backend and so on its own session stream (one per agent in a real job).

``--floor CALLS`` makes no round: each simulated node makes CALLS bare ``Get`` calls and returns,
through the backend's own client in threads (as above) or, with ``--floor-client aio``, through
bare ``grpc.aio`` stubs in asyncio tasks (no handler, no retry, no JSON: grpcio's own cost). It
shows what the calls alone cost this machine, before any rendezvous protocol.

Bytes per node are the TCP payload (gRPC's HTTP/2 frames included) that each client process's
connections to the server received and sent during the round, read from the kernel
(``TCP_INFO``, :mod:`tools.bench.tcp_bytes`), divided by the nodes of the process.

``--nodes`` takes several counts (one fresh server each); ``--torch N,...`` also times torch's
c10d rendezvous with that many real node processes (as ``tools/bench/rendezvous.py`` does);
``--json FILE`` stores the figures and ``--plot FILE.svg`` draws server CPU per node and wall time
against N on log scales (:mod:`tools.bench.svg_chart`, no plotting dependency).

Run from the repository root:

    .venv/bin/python tools/bench/grpc_server_scale.py --nodes 4096 --procs 8
    .venv/bin/python tools/bench/grpc_server_scale.py --nodes 256,1024,4096 --procs 16 --torch 2,64 \\
        --json docs/bench/grpc_server_scale.json --plot docs/bench/grpc_server_scale.svg
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
from typing import Any

if __package__ in (None, ""):  # run as a script: make `tools.bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench.harness import format_duration
from tools.bench.rendezvous import RendezvousSide, VirtualClock, _parse_sizes
from tools.bench.svg_chart import Panel, log_log_chart
from tools.bench.tcp_bytes import tcp_bytes

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
    p.add_argument("--no-assign", action="store_true")
    a = p.parse_args(argv)
    if a.floor and a.floor_client == "aio":
        return _aio_floor(a)

    from rallypoint.agent.node_share import assign_function, share_of
    from rallypoint.agent.settings import AgentSettings
    from rallypoint.rendezvous.handler import RendezvousHandler
    from rallypoint.rendezvous.state import NodeInfo
    from rallypoint.rendezvous.timeouts import RendezvousTimeouts
    from rallypoint_grpc.rendezvous.backend import GrpcBackend

    # the agent's real path: the node that completes the round runs the rank strategy once and
    # each node decodes its own share of it (rallypoint.agent.node_share)
    settings = AgentSettings(argv=["train.py"], run_id="scale")
    assign = None if a.no_assign else assign_function(settings)

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
            assign=assign,
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
                share = None if assign is None else share_of(settings, r)  # this node's ranks
                item = {"t": time.monotonic(), "rank": r.group_rank, "round": r.round, "n": r.num_nodes}
                if share is not None:
                    item["world"] = share.world_size
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            item = {"error": f"{type(exc).__name__}: {exc}"}
        with lock:
            out.append(item)

    threads = [threading.Thread(target=node, args=(a.first + i, h), daemon=True) for i, h in enumerate(handlers)]
    port = int(a.endpoint.rsplit(":", 1)[1])
    print("ready", flush=True)
    os.read(a.start_fd, 1)
    before = tcp_bytes(port)
    cpu = time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    cpu = time.process_time() - cpu
    received, sent = _bytes_delta(before, tcp_bytes(port))
    print(json.dumps({"cpu": cpu, "received": received, "sent": sent, "nodes": out}), flush=True)
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

            port = int(a.endpoint.rsplit(":", 1)[1])
            before = tcp_bytes(port)
            cpu = time.process_time()
            await asyncio.gather(*(node(i) for i in range(a.first, a.first + a.count)))
            cpu = time.process_time() - cpu
            received, sent = _bytes_delta(before, tcp_bytes(port))
            report = {"cpu": cpu, "received": received, "sent": sent, "nodes": out}
            print(json.dumps(report), flush=True)

    asyncio.run(run())
    os._exit(0)


def _counts(text: str) -> tuple[int, ...]:
    """``--nodes``/``--torch``: comma-separated positive integers."""
    try:
        return _parse_sizes(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"wants comma-separated positive integers, got {text!r}") from None


def _bytes_delta(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """Bytes received and sent between two :func:`tcp_bytes` readings (a socket new since counts whole)."""
    received = sent = 0
    for inode, (rx, tx) in after.items():
        rx0, tx0 = before.get(inode, (0, 0))
        received, sent = received + rx - rx0, sent + tx - tx0
    return received, sent


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _memory_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _round(
    nodes: int, procs: int, floor: int, floor_client: str, profile: str | None = None, *, assign: bool = True
) -> dict[str, Any]:
    """One server, ``nodes`` simulated nodes in ``procs`` client processes, one round (or floor), checked.

    With ``profile``, the server runs under cProfile and writes its profile there when it stops.
    """
    cmd = [RALLYPOINT, "rdzv", "serve", "--port", "0"]
    if profile:
        cmd = [sys.executable, "-m", "cProfile", "-o", profile, *cmd]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert server.stdout is not None
    endpoint = server.stdout.readline().split("serving on ")[1].split()[0]
    start_r, start_w = os.pipe()
    per = -(-nodes // procs)
    clients = []
    try:
        for first in range(0, nodes, per):
            count = min(per, nodes - first)
            cmd = [sys.executable, __file__, "--worker", "--endpoint", endpoint, "--first", str(first)]
            cmd += ["--count", str(count), "--nodes", str(nodes), "--start-fd", str(start_r)]
            cmd += ["--floor", str(floor), "--floor-client", floor_client] + ([] if assign else ["--no-assign"])
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
        results, client_cpu, received, sent = [], 0.0, 0, 0
        for c in clients:
            assert c.stdout is not None
            line = c.stdout.readline()
            if not line.strip():
                raise SystemExit(f"a client process (pid {c.pid}) exited without its report; see its stderr above")
            report = json.loads(line)
            results.extend(report["nodes"])
            client_cpu += report["cpu"]
            received += report.get("received", 0)
            sent += report.get("sent", 0)
        cpu1 = _cpu_seconds(server.pid)
        peak, rss1 = _memory_mib(server.pid, "VmHWM"), _memory_mib(server.pid, "VmRSS")
    finally:
        for c in clients:
            c.kill()
        if profile:  # SIGTERM: the server stops cleanly and cProfile writes its file
            server.terminate()
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
        else:
            server.kill()
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise SystemExit(f"{len(errors)} node(s) failed, e.g. {errors[0]}")
    ranks = sorted(r["rank"] for r in results)
    if ranks != list(range(nodes)) or len({r["round"] for r in results}) != 1:
        raise SystemExit(f"wrong result: {len(results)} nodes, rounds {sorted({r['round'] for r in results})}")
    if any(r.get("world", nodes) != nodes for r in results):
        raise SystemExit(f"wrong world size in a node's share: {sorted({r.get('world') for r in results})}")
    return {
        "nodes": nodes,
        "assign": assign and not floor,
        "procs": procs,
        "per_proc": per,
        "wall_s": max(r["t"] for r in results) - released,
        "server_cpu_s": cpu1 - cpu0,
        "client_cpu_s": client_cpu,
        "bytes_received_per_node": received / nodes,
        "bytes_sent_per_node": sent / nodes,
        "server_rss_mib_before": rss0,
        "server_rss_mib_after": rss1,
        "server_peak_mib": peak,
    }


def _report(r: dict[str, Any], floor: int, floor_client: str) -> None:
    kind = "asyncio tasks" if floor and floor_client == "aio" else "threads"
    shape = f"{r['procs']} client processes x {r['per_proc']} {kind}, one channel each"
    print(f"grpc server scale: {r['nodes']} nodes ({shape})")
    if floor:
        print(f"floor: {floor} bare Get call(s) per node, no rendezvous protocol ({floor_client} clients)")
        print(f"release to the last node's last call: {format_duration(r['wall_s'])}")
    else:
        print(f"one round, release to last next_rendezvous() return: {format_duration(r['wall_s'])}")
    print(f"server CPU during the round: {r['server_cpu_s']:.2f} s (user + system)")
    print(f"client processes' CPU during the round: {r['client_cpu_s']:.2f} s in all")
    print(
        f"bytes per node (TCP payload, gRPC framing included): {r['bytes_received_per_node']:.0f} received, "
        f"{r['bytes_sent_per_node']:.0f} sent"
    )
    print(
        f"server memory: {r['server_rss_mib_before']:.0f} MiB before the round, {r['server_rss_mib_after']:.0f} MiB "
        f"after, peak {r['server_peak_mib']:.0f} MiB",
        flush=True,
    )


def _print_profile(path: str) -> None:
    import pstats

    if not Path(path).exists():
        print(f"server profile: {path} was not written (the server did not stop cleanly)", flush=True)
        return
    print(f"server profile (whole server life, under cProfile): {path}; own time, top 15:", flush=True)
    pstats.Stats(path, stream=sys.stdout).sort_stats("tottime").print_stats(15)


def _torch(nodes: int) -> dict[str, Any]:
    """One torch c10d rendezvous of ``nodes`` fresh node processes (tools/bench/rendezvous.py's side B)."""
    wall = RendezvousSide("torch", nodes, VirtualClock()).run_once()
    print(
        f"torch c10d N={nodes}: one rendezvous of {nodes} node processes, release to last return: "
        f"{format_duration(wall)}",
        flush=True,
    )
    return {"nodes": nodes, "wall_s": wall}


def _chart(rounds: list[dict[str, Any]], torch: list[dict[str, Any]], caption: str) -> str:
    """The chart of ``--plot``: server CPU per node and round wall time against N, on log scales.

    A round whose server CPU reads 0 (less than one clock tick, 10 ms: a small round) has no
    place on a log scale and is left out of the CPU panel, which the caption says.
    """
    measured = [r for r in rounds if r["server_cpu_s"] > 0]
    below = [r["nodes"] for r in rounds if r["server_cpu_s"] <= 0]
    wall: dict[str, list[tuple[float, float]]] = {"rallypoint grpc": [(r["nodes"], r["wall_s"]) for r in rounds]}
    if torch:
        wall["torch c10d"] = [(t["nodes"], t["wall_s"]) for t in torch]
    panels = [Panel("Round wall time", "seconds, release to last return", wall)]
    if measured:
        per_node = [(r["nodes"], r["server_cpu_s"] / r["nodes"] * 1e3) for r in measured]
        cpu: dict[str, list[tuple[float, float]]] = {"rallypoint grpc: server CPU per node": per_node}
        panels.insert(0, Panel("Server CPU per node", "ms of CPU per node", cpu))
    if below:
        sizes = ", ".join(str(n) for n in below)
        caption += f" (server CPU below one clock tick at N = {sizes}: not drawn)"
    return log_log_chart(panels, caption=caption)


def main(argv: list[str] | None = None) -> int:
    """Start the server and the client processes, release them, check and report, for each N."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--nodes", type=_counts, default=(4096,), metavar="N,N,...", help="simulated node counts (default 4096)"
    )
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
    parser.add_argument(
        "--torch",
        type=_counts,
        default=(),
        metavar="N,N,...",
        help="also time torch's c10d rendezvous with this many real node processes (a torch node needs ~150 MB: "
        "64 is about the most this 2-CPU machine runs)",
    )
    parser.add_argument(
        "--no-assign",
        action="store_true",
        help="no rank assignment: the handlers get no assignment function (by default the agent's: the node that "
        "completes the round runs the rank strategy once, each node decodes its own share of it)",
    )
    parser.add_argument("--json", metavar="FILE", help="store the figures as JSON")
    parser.add_argument(
        "--server-profile",
        metavar="FILE",
        help="run the server under cProfile and store its profile (FILE, or FILE.<N> for several N) and "
        "print its 15 most expensive functions (own time); the profiler slows the server",
    )
    parser.add_argument(
        "--plot", metavar="FILE.svg", help="draw server CPU per node and wall time against N (log scales) as SVG"
    )
    args = parser.parse_args(argv)
    if args.floor < 0:
        parser.error(f"--floor wants a count >= 0, got {args.floor}")
    if args.floor_client != "threads" and not args.floor:
        parser.error("--floor-client applies to --floor runs only")
    if args.procs < 1:
        parser.error(f"--procs wants a count >= 1, got {args.procs}")
    if args.plot and not args.plot.endswith(".svg"):
        parser.error(f"--plot wants a file name ending in .svg, got {args.plot!r}")
    rounds = []
    for n in args.nodes:
        profile = None
        if args.server_profile:
            profile = args.server_profile if len(args.nodes) == 1 else f"{args.server_profile}.{n}"
        r = _round(n, min(args.procs, n), args.floor, args.floor_client, profile, assign=not args.no_assign)
        _report(r, args.floor, args.floor_client)
        if profile:
            _print_profile(profile)
        rounds.append(r)
    torch = [_torch(n) for n in args.torch]
    load = os.getloadavg()
    caption = (
        f"{'floor: ' + str(args.floor) + ' bare call(s) per node; ' if args.floor else ''}"
        f"{os.cpu_count()} CPUs, load average {load[0]:.1f} at the end; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    if args.json:
        data = {"title": "grpc server scale", "floor": args.floor, "caption": caption}
        data |= {"rounds": rounds, "torch_c10d": torch}
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n")
    if args.plot:
        Path(args.plot).write_text(_chart(rounds, torch, caption))
    return 0


if __name__ == "__main__":
    if "--worker" in sys.argv[1:]:
        sys.exit(_worker([a for a in sys.argv[1:] if a != "--worker"]))
    sys.exit(main())
