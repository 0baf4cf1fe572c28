"""The remote object of the seeds, with ``rallypoint.rpc`` in place of ``torch.distributed.rpc``.

worker0 creates a ``Counter`` on worker1 (``remote``), adds to it through the RRef's proxy,
fetches it back (``to_here``), and hands the RRef to worker2, which adds to the same object.
Run it with ``rallypoint run examples/rpc/counter.toml`` (3 workers); ``--out DIR`` writes the
result as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from rallypoint import rpc


@rpc.expose
class Counter:
    """A tensor that remote callers add to."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def add(self, t2: torch.Tensor) -> torch.Tensor:
        """Add ``t2`` and return the new total."""
        self.t = self.t + t2
        return self.t


@rpc.expose
def add_from_elsewhere(rref: rpc.RRef[Counter], t2: torch.Tensor) -> str:
    """Run on worker2: the RRef still points at worker1's Counter."""
    rref.rpc_sync().add(t2)
    return f"{rpc.get_worker_info().name} added through an RRef owned by {rref.owner_name()}"


def main() -> None:
    """Every worker joins; worker0 drives; everyone leaves together."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    rpc.init_rpc(f"worker{rank}")
    if rank == 0:
        t, t2 = torch.ones(2), torch.full((2,), 2.0)
        rref = rpc.remote("worker1", Counter, args=(t,))
        rref.rpc_sync().add(t2)
        counter = rref.to_here()
        note = rpc.rpc_sync("worker2", add_from_elsewhere, args=(rref, t2))
        result = {
            "owner": [rref.owner().name, rref.owner().id],
            "after_add": counter.t.tolist(),
            "after_worker2": rref.to_here().t.tolist(),
            "note": note,
        }
        print(json.dumps(result))
        if args.out is not None:
            (args.out / "counter.json").write_text(json.dumps(result))
    rpc.shutdown()


if __name__ == "__main__":
    main()
