#!/usr/bin/env python3
"""Namespace hosts by hand: N "hosts" with their own addresses and names, for trying multi-host jobs.

    sudo python3 tools/netns_hosts.py 2            # make nodea, nodeb; print how to use them; wait
    sudo python3 tools/netns_hosts.py 2 -- CMD...  # run CMD on every host at once ({host}, {addr},
                                                   # {peers} are substituted), then tear down
    sudo python3 tools/netns_hosts.py --sweep      # remove hosts left by a run that was killed

While waiting, `ip netns exec NS unshare --uts sh -c 'hostname NAME; exec bash'` opens a shell on a
host (the exact line is printed). Ctrl-C tears everything down. See integration-tests/netns.py.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration-tests"))

import netns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("count", nargs="?", type=int, default=2, help="how many hosts (default 2)")
    parser.add_argument("--sweep", action="store_true", help="remove hosts left by killed runs, then exit")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD...: run on every host, then exit")
    args = parser.parse_args(argv)
    if args.sweep:
        removed = netns.sweep_stale()
        print(f"removed {len(removed)}: {' '.join(removed)}" if removed else "nothing left behind")
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        network = netns.HostNetwork(args.count)
    except netns.NetnsUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # SIGTERM (kill, a CI job cancelled) and SIGHUP (the terminal closed) tear down like Ctrl-C
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(129))
    try:
        for host in network.hosts:
            shell = shlex.join(host.command(["bash"]))
            print(f"{host.name}  {host.addr}  shell: {shell}")
        if not command:
            print("Ctrl-C to tear down")
            signal.pause()
            return 0
        peers = ",".join(h.addr for h in network.hosts)
        procs = [
            h.popen([part.format(host=h.name, addr=h.addr, peers=peers) for part in command]) for h in network.hosts
        ]
        return max(proc.wait() for proc in procs)
    except KeyboardInterrupt:
        return 130
    finally:
        network.close()


if __name__ == "__main__":
    sys.exit(main())
