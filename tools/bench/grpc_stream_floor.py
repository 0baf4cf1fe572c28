"""The floor of a streamed round: one message in and one out per node on a bidirectional stream.

No rendezvous protocol: a bare ``grpc.aio`` server (one generic bidirectional method, raw bytes,
no protobuf) answers nothing until ``N`` streams have each sent one small join message (about
100 bytes); then it writes one small pre-encoded reply (about 100 bytes: a rank, the world size,
an address, a round id and a digest) to every stream, in one batch. ``N`` simulated nodes are
``grpc.aio`` streams in asyncio tasks, ``--procs`` client processes with one channel each.

This is the least a round of the design of issue #38 (one long-lived stream per agent, the
server batching per round) can cost grpcio's Python server and clients on this machine: the
time from release to the last reply, the server's CPU and the clients' CPU. If the floor is over
a target, no protocol on this stack meets it.

Run from the repository root:

    .venv/bin/python tools/bench/grpc_stream_floor.py --nodes 256,1024,4096 --procs 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `tools.bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.bench.grpc_server_scale import _bytes_delta, _counts, _cpu_seconds, _memory_mib
from tools.bench.harness import format_duration
from tools.bench.tcp_bytes import tcp_bytes

METHOD = "/rallypoint.bench.v1.Floor/Round"
TIMEOUT = 300.0
#: grpc core cancels calls that wait for the server to take them beyond a pending-request limit
#: (soft 1000, hard 3000 by default): a round's streams all arrive at once, so raise both.
SERVER_OPTIONS = [
    ("grpc.max_concurrent_streams", 1 << 20),
    ("grpc.server.max_pending_requests", 1 << 20),
    ("grpc.server.max_pending_requests_hard_limit", 1 << 20),
]


def _server(nodes: int) -> int:
    """The bare server: answers every stream once ``nodes`` of them have joined; prints its port."""
    import grpc

    async def run() -> None:
        waiting: list[Any] = []
        done = asyncio.Event()

        async def round_(requests: Any, context: Any) -> Any:
            async for _join in requests:
                queue: asyncio.Queue[bytes] = asyncio.Queue()
                waiting.append(queue)
                if len(waiting) == nodes:  # the round is complete: one reply to each, encoded once
                    for rank, q in enumerate(waiting):
                        q.put_nowait(
                            b'{"rank":%d,"world":%d,"store":"127.0.0.1:29500","round":1,"digest":"%s"}'
                            % (rank, nodes, b"0" * 32)
                        )
                    waiting.clear()
                    done.set()
                yield await queue.get()
                return

        handler = grpc.stream_stream_rpc_method_handler(round_)
        generic = grpc.method_handlers_generic_handler("rallypoint.bench.v1.Floor", {"Round": handler})
        server = grpc.aio.server(options=SERVER_OPTIONS)
        server.add_generic_rpc_handlers((generic,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print(port, flush=True)
        await server.wait_for_termination()

    asyncio.run(run())
    return 0


def _client(argv: list[str]) -> int:
    """One client process: ``count`` streams on one channel; prints ready, then its report."""
    import grpc

    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--start-fd", type=int, required=True)
    a = p.parse_args(argv)

    async def run() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{a.port}") as channel:
            await channel.channel_ready()
            call = channel.stream_stream(METHOD)
            print("ready", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, os.read, a.start_fd, 1)
            before = tcp_bytes(a.port)
            cpu = time.process_time()
            out: list[dict[str, Any]] = []

            async def node() -> None:
                stream = call()
                await stream.write(b'{"join":"node","host":"host","addr":"127.0.0.1","port":29500,"inc":"0123456789"}')
                reply = await stream.read()
                out.append({"t": time.monotonic(), **json.loads(reply)})
                await stream.done_writing()

            await asyncio.wait_for(asyncio.gather(*(node() for _ in range(a.count))), TIMEOUT)
            cpu = time.process_time() - cpu
            received, sent = _bytes_delta(before, tcp_bytes(a.port))
            print(json.dumps({"cpu": cpu, "received": received, "sent": sent, "nodes": out}), flush=True)

    asyncio.run(run())
    os._exit(0)


def _round(nodes: int, procs: int) -> dict[str, Any]:
    server = subprocess.Popen([sys.executable, __file__, "--server", str(nodes)], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    port = int(server.stdout.readline())
    start_r, start_w = os.pipe()
    per = -(-nodes // procs)
    clients = []
    try:
        for first in range(0, nodes, per):
            cmd = [sys.executable, __file__, "--client", "--port", str(port), "--count", str(min(per, nodes - first))]
            cmd += ["--start-fd", str(start_r)]
            clients.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, pass_fds=(start_r,)))
        os.close(start_r)
        for c in clients:
            assert c.stdout is not None
            if c.stdout.readline().strip() != "ready":
                raise SystemExit("a client process failed to start")
        cpu0, rss0 = _cpu_seconds(server.pid), _memory_mib(server.pid, "VmRSS")
        released = time.monotonic()
        os.close(start_w)
        results: list[dict[str, Any]] = []
        client_cpu, received = 0.0, 0
        for c in clients:
            assert c.stdout is not None
            line = c.stdout.readline()
            if not line.strip():
                raise SystemExit(f"client process {c.pid} exited without its report")
            report = json.loads(line)
            results += report["nodes"]
            client_cpu += report["cpu"]
            received += report["received"]
        cpu1, peak = _cpu_seconds(server.pid), _memory_mib(server.pid, "VmHWM")
    finally:
        for c in clients:
            c.kill()
        server.kill()
    if sorted(r["rank"] for r in results) != list(range(nodes)) or {r["world"] for r in results} != {nodes}:
        raise SystemExit(f"wrong result: {len(results)} replies")
    r = {
        "nodes": nodes,
        "wall_s": max(x["t"] for x in results) - released,
        "server_cpu_s": cpu1 - cpu0,
        "client_cpu_s": client_cpu,
        "bytes_received_per_node": received / nodes,
        "server_rss_mib_before": rss0,
        "server_peak_mib": peak,
    }
    print(
        f"stream floor N={nodes} ({len(clients)} client processes): release to last reply "
        f"{format_duration(r['wall_s'])}, server CPU {r['server_cpu_s']:.2f} s "
        f"({r['server_cpu_s'] / nodes * 1e6:.0f} us per node), clients' CPU {client_cpu:.2f} s, "
        f"{r['bytes_received_per_node']:.0f} bytes received per node, server peak {peak:.0f} MiB",
        flush=True,
    )
    return r


def main(argv: list[str] | None = None) -> int:
    """Measure the floor for each N."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=_counts, default=(256, 1024, 4096), metavar="N,N,...")
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--json", metavar="FILE", help="store the figures as JSON")
    args = parser.parse_args(argv)
    if args.procs < 1:
        parser.error(f"--procs wants a count >= 1, got {args.procs}")
    rounds = [_round(n, min(args.procs, n)) for n in args.nodes]
    if args.json:
        Path(args.json).write_text(json.dumps({"title": "grpc stream floor", "rounds": rounds}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--server"]:
        sys.exit(_server(int(sys.argv[2])))
    if sys.argv[1:2] == ["--client"]:
        sys.exit(_client(sys.argv[2:]))
    sys.exit(main())
