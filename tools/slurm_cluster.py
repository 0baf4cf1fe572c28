#!/usr/bin/env python3
"""A Slurm cluster by hand: a controller and N compute hosts on namespace hosts, for trying jobs.

    sudo python3 tools/slurm_cluster.py 3      # ctl + node1..node3; print how to use it; wait
    sudo python3 tools/slurm_cluster.py --sweep  # remove namespace hosts left by a killed run

Needs Debian's Slurm and munge: `apt-get install -y slurmctld slurmd slurm-client munge`. While it
waits, the printed line opens a shell on the controller with SLURM_CONF set, where `sinfo`,
`sbatch`, `srun` and `scancel` work as on a cluster. Ctrl-C tears everything down (daemons, jobs,
namespaces, the cluster's folder). See integration-tests/slurm_cluster.py.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration-tests"))

import netns
import slurm_cluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("count", nargs="?", type=int, default=3, help="how many compute hosts (default 3)")
    parser.add_argument("--sweep", action="store_true", help="remove hosts left by killed runs, then exit")
    args = parser.parse_args(argv)
    if args.sweep:
        removed = netns.sweep_stale()
        print(f"removed {len(removed)}: {' '.join(removed)}" if removed else "nothing left behind")
        return 0
    try:
        cluster = slurm_cluster.SlurmCluster(args.count)
    except (slurm_cluster.SlurmUnavailable, netns.NetnsUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(129))
    try:
        shell = shlex.join(["env", f"SLURM_CONF={cluster.conf}", *cluster.command(["bash"])])
        print(f"controller {cluster.controller.name} {cluster.controller.addr}; config {cluster.conf}")
        for node in cluster.nodes:
            print(f"{node.name}  {node.addr}")
        print(f"shell on the controller: {shell}")
        print("Ctrl-C to tear down")
        signal.pause()
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        cluster.close()


if __name__ == "__main__":
    sys.exit(main())
