"""Data shared across workers by RRefs: the data stays on its owner, workers pass references.

worker0 owns a dataset (``rpc.RRef(tensor)``) and asks worker1 and worker2 to each sum one half
of it; they fetch it through the RRef. worker1 then shares a table of its own with worker2
*through worker0*, which never fetches it: an RRef passed on stays a reference to worker1's
object. Every worker checks the answers. Run with ``rallypoint run examples/rpc/shared.toml``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from rallypoint import rpc


@rpc.expose
def partial_sum(data: rpc.RRef[torch.Tensor], part: int, parts: int) -> float:
    """Sum one slice of the shared data (fetched from its owner)."""
    values = data.to_here()
    return float(values.chunk(parts)[part].sum())


@rpc.expose
def make_table() -> rpc.RRef[dict[str, list[int]]]:
    """Create a table owned by this worker and return a reference to it."""
    return rpc.RRef({"squares": [i * i for i in range(10)]})


@rpc.expose
def relay(table: rpc.RRef[dict[str, list[int]]], to: str) -> int:
    """Pass a reference on to another worker without fetching the value."""
    return rpc.rpc_sync(to, lookup, args=(table, 7))


@rpc.expose
def lookup(table: rpc.RRef[dict[str, list[int]]], i: int) -> int:
    """Read one entry of a table owned elsewhere."""
    return table.to_here()["squares"][i]


def main() -> None:
    """worker0 drives; all workers serve; everyone leaves together."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    rpc.init_rpc(f"worker{rank}")
    if rank == 0:
        data = rpc.RRef(torch.arange(1000, dtype=torch.float64))
        futures = [rpc.rpc_async(f"worker{i + 1}", partial_sum, args=(data, i, 2)) for i in range(2)]
        sums = [f.wait() for f in futures]
        table = rpc.rpc_sync("worker1", make_table)
        result = {
            "sums": sums,
            "total": sum(sums),
            "expected": float(data.local_value().sum()),
            "table_owner": table.owner_name(),
            "relayed": rpc.rpc_sync("worker2", relay, args=(table, "worker1")),
            "fetched_by_worker0": table.to_here()["squares"][3],
        }
        print(json.dumps(result))
        if args.out is not None:
            (args.out / "shared.json").write_text(json.dumps(result))
    rpc.shutdown()


if __name__ == "__main__":
    main()
