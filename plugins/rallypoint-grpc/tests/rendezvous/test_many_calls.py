"""Thousands of calls arriving at once at one ``rallypoint rdzv serve`` are all served (#38).

grpc core cancels calls that the server has not taken up yet beyond its pending-call limits
(1000 soft, 3000 hard by default). A round of thousands of agents sends that many joins and
watches at once: 784 of 4000 held watches came back ``CANCELLED`` before the server raised them.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc

from rallypoint_grpc._proto import rendezvous_pb2 as pb
from rallypoint_grpc._proto import rendezvous_pb2_grpc as pb_grpc
from rallypoint_grpc.transport import MAX_PENDING_CALLS, server_options

from .conftest import ServerProcess

CALLS = 4000


def test_the_server_options_leave_room_for_thousands_of_pending_calls() -> None:
    options = dict(server_options())
    assert options["grpc.server.max_pending_requests"] == MAX_PENDING_CALLS
    assert options["grpc.server.max_pending_requests_hard_limit"] >= CALLS


def test_4000_watches_opened_at_once_are_all_answered(server: ServerProcess) -> None:
    async def run() -> Counter[str]:
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = pb_grpc.RendezvousStub(channel)  # type: ignore[no-untyped-call]
            await stub.Get(pb.GetRequest(space="many", key="k"), timeout=60)  # connected first

            async def watch() -> str:
                try:
                    events = stub.Watch(pb.WatchRequest(space="many", key="k", timeout=2.0), timeout=120)
                    event = await events.read()
                    return "timeout" if not event.changed else "changed"
                except grpc.aio.AioRpcError as exc:
                    return exc.code().name

            return Counter(await asyncio.gather(*(watch() for _ in range(CALLS))))

    outcomes = asyncio.run(run())
    assert outcomes == Counter({"timeout": CALLS}), outcomes
    assert server.alive()
