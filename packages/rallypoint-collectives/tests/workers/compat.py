"""Worker: a torchrun-style script that calls torch.distributed.init_process_group itself.

It must run unmodified under the agent (same variables as torchrun); the facade then adopts the
process group that torch created.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")  # env:// from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    assert rank == int(os.environ["RANK"])
    assert world == int(os.environ["WORLD_SIZE"])
    assert int(os.environ["LOCAL_RANK"]) == rank
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    assert t.item() == world * (world + 1) / 2, t
    dist.barrier()

    import rallypoint.collectives as rc

    info = rc.init()  # adopts torch's group
    assert info.backend == "gloo", info
    assert info.rank == rank, info
    assert rc.default_timeout() == float(os.environ["RALLYPOINT_COLLECTIVES_TIMEOUT"])
    u = rc.all_reduce(torch.tensor([1.0]), op=rc.ReduceOp.MAX)
    assert u.item() == 1.0
    rc.barrier()
    print("RESULT ok", flush=True)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)
