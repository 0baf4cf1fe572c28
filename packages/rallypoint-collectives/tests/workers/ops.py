"""Worker: every facade operation with every reduce op, checked against a local reference.

Started N times by the test launcher (or the agent). Prints ``CHECK <name>`` per passed check and
``RESULT ok`` at the end; exits non-zero with a traceback on the first failure.
"""

from __future__ import annotations

import os
import sys
import traceback

import torch

import rallypoint.collectives as rc


def value(rank: int, device: str) -> torch.Tensor:
    # distinct, non-zero, small: PRODUCT stays exact in float64
    return torch.tensor([rank + 1.0, -(rank + 2.0), 0.5 * (rank + 1), 3.0], dtype=torch.float64, device=device)


def reference(op: object, tensors: list[torch.Tensor]) -> torch.Tensor:
    stack = torch.stack(tensors)
    if op == rc.ReduceOp.SUM:
        return stack.sum(0)
    if op == rc.ReduceOp.PRODUCT:
        return stack.prod(0)
    if op == rc.ReduceOp.MAX:
        return stack.max(0).values
    if op == rc.ReduceOp.MIN:
        return stack.min(0).values
    if op == rc.ReduceOp.AVG:
        return stack.mean(0)
    raise AssertionError(op)


def check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if not torch.allclose(got.cpu(), want.cpu()):
        raise AssertionError(f"{name}: got {got.tolist()}, want {want.tolist()}")
    print(f"CHECK {name}", flush=True)


def main() -> None:
    info = rc.init()
    device = "cuda" if info.device == "cuda" else "cpu"
    rank, world = rc.get_rank(), rc.get_world_size()
    assert (rank, world) == (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    print(f"INFO backend={info.backend} reason={info.reason} timeout={info.timeout}", flush=True)
    everyone = [value(r, device) for r in range(world)]
    ops = {"SUM": rc.ReduceOp.SUM, "PRODUCT": rc.ReduceOp.PRODUCT, "MAX": rc.ReduceOp.MAX, "MIN": rc.ReduceOp.MIN}
    ops["AVG"] = rc.ReduceOp.AVG

    for name, op in ops.items():
        t = value(rank, device)
        out = rc.all_reduce(t, op=op)
        assert out is t
        check(f"all_reduce {name}", t, reference(op, everyone))

        dst = world - 1
        t = value(rank, device)
        assert rc.reduce(t, dst, op=op) is t
        if rank == dst:
            check(f"reduce {name}", t, reference(op, everyone))

        # async with wait(), and the torch op object passed straight through
        t = value(rank, device)
        work = rc.all_reduce(t, op=op, async_op=True)
        assert isinstance(work, rc.Work)
        assert work.wait() is True
        assert work.is_completed()
        assert work.result() is t
        check(f"all_reduce async {name}", t, reference(op, everyone))

        t = value(rank, device)
        rc.all_reduce(t, op=op, timeout=30)
        check(f"all_reduce timeout= {name}", t, reference(op, everyone))

    one = min(1, world - 1)
    t = value(rank, device) if rank == one else torch.zeros(4, dtype=torch.float64, device=device)
    assert rc.broadcast(t, src=one) is t
    check("broadcast", t, everyone[one])
    t = value(rank, device) if rank == 0 else torch.zeros(4, dtype=torch.float64, device=device)
    rc.broadcast(t, src=0, async_op=True).wait(timeout=30)
    check("broadcast async", t, everyone[0])

    outs = [torch.zeros(4, dtype=torch.float64, device=device) for _ in range(world)]
    assert rc.all_gather(outs, value(rank, device)) is outs
    for r in range(world):
        check(f"all_gather [{r}]", outs[r], everyone[r])

    gl = [torch.zeros(4, dtype=torch.float64, device=device) for _ in range(world)] if rank == 0 else None
    got = rc.gather(value(rank, device), gl, dst=0)
    if rank == 0:
        assert got is gl
        assert gl is not None
        for r in range(world):
            check(f"gather [{r}]", gl[r], everyone[r])
    else:
        assert got is None

    src = world - 1
    sl = [value(r, device) * 10 for r in range(world)] if rank == src else None
    t = torch.zeros(4, dtype=torch.float64, device=device)
    assert rc.scatter(t, sl, src=src) is t
    check("scatter", t, everyone[rank] * 10)

    assert rc.barrier() is None
    rc.barrier(timeout=30)
    rc.barrier(async_op=True).wait()
    print("CHECK barrier", flush=True)

    if world == 1:  # a single GPU (NCCL): no peers for point-to-point or sub-groups
        rc.barrier()
        print("RESULT ok", flush=True)
        return
    # point to point: blocking, in order
    if rank == 0:
        for i in range(3):
            rc.send(torch.full((2,), float(i), device=device), dst=1)
    elif rank == 1:
        for i in range(3):
            t = torch.zeros(2, device=device)
            assert rc.recv(t, src=0) == 0
            check(f"send/recv order {i}", t, torch.full((2,), float(i)))
    # any source
    if rank == 1:
        rc.send(torch.full((2,), 7.0, device=device), dst=0, tag=99, timeout=30)
    elif rank == 0:
        t = torch.zeros(2, device=device)
        sender = rc.recv(t, tag=99, timeout=30) if device == "cpu" else rc.recv(t, src=1, tag=99)
        assert sender == 1, sender
        check("recv any source", t, torch.full((2,), 7.0))
    # async ring: several messages in flight, waited in reverse order, arrive in order
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    sends = [rc.isend(torch.full((3,), float(rank * 100 + i), device=device), nxt, tag=10 + i) for i in range(4)]
    bufs = [torch.zeros(3, device=device) for _ in range(4)]
    recvs = [rc.irecv(bufs[i], prv, tag=10 + i) for i in range(4)]
    for w in reversed([*sends, *recvs]):
        assert w is not None
        assert w.wait() is True
    for i in range(4):
        check(f"isend/irecv ring {i}", bufs[i], torch.full((3,), float(prv * 100 + i)))

    # sub-groups (every rank creates every group, as torch requires)
    ends = rc.new_group([0, world - 1])
    rest = rc.new_group(list(range(1, world)))
    if rank in (0, world - 1):
        for name, op in ops.items():
            t = value(rank, device)
            rc.all_reduce(t, op=op, group=ends)
            check(f"sub-group all_reduce {name}", t, reference(op, [everyone[0], everyone[world - 1]]))
        assert rc.get_world_size(ends) == 2
        assert rc.get_rank(ends) == (0 if rank == 0 else 1)
        rc.barrier(group=ends, timeout=30)
    if rank >= 1:
        t = value(rank, device) if rank == world - 1 else torch.zeros(4, dtype=torch.float64, device=device)
        rc.broadcast(t, src=world - 1, group=rest)
        check("sub-group broadcast", t, everyone[world - 1])
        outs = [torch.zeros(4, dtype=torch.float64, device=device) for _ in range(world - 1)]
        rc.all_gather(outs, value(rank, device), group=rest)
        for i, r in enumerate(range(1, world)):
            check(f"sub-group all_gather [{r}]", outs[i], everyone[r])
        if rank == world - 1 and world > 2:
            t = torch.zeros(2, device=device)
            assert rc.recv(t, src=1, group=rest) == 1
            check("sub-group recv", t, torch.full((2,), 5.0))
        elif rank == 1 and world > 2:
            rc.send(torch.full((2,), 5.0, device=device), dst=world - 1, group=rest)

    rc.barrier()
    print("RESULT ok", flush=True)


if __name__ == "__main__":
    try:
        main()
    except BaseException:  # noqa: BLE001 - report any failure, then exit non-zero
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip torch's process-group teardown at exit (not what is tested here)
