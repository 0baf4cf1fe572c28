"""The namespace-host fixture itself: addresses, host names, name resolution, partitions, teardown."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import netns

PY = sys.executable

SERVE_ONCE = (
    "import socket, sys\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('0.0.0.0', 5555)); s.listen(); print('ready', flush=True)\n"
    "c, _ = s.accept(); c.sendall(socket.gethostname().encode())\n"
)
CONNECT = (
    "import socket, sys\n"
    "s = socket.create_connection((sys.argv[1], 5555), timeout=float(sys.argv[2]))\n"
    "print(s.recv(100).decode())\n"
)


def test_hosts_have_own_names_addresses_and_cloud_style_resolution(hosts):
    net = hosts(2)
    a, b = net.hosts
    assert a.run(["hostname"]).stdout.strip() == "nodea"
    resolve = "import socket; print(socket.gethostbyname(socket.gethostname()), socket.gethostbyname('nodeb'))"
    out = a.run([PY, "-c", resolve]).stdout.split()
    # the host's own name resolves to loopback (as on many cloud images); the other host's to its address
    assert out == ["127.0.0.1", b.addr]
    addrs = a.run(["ip", "-4", "-o", "addr", "show", "dev", "eth0"]).stdout
    assert a.addr in addrs


def test_hosts_reach_each_other_until_partitioned(hosts):
    net = hosts(2)
    a, b = net.hosts
    server = b.popen([PY, "-c", SERVE_ONCE], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    assert server.stdout.readline().strip() == "ready"
    reply = a.run([PY, "-c", CONNECT, "nodeb", "10"])
    assert reply.returncode == 0, reply.stderr
    assert reply.stdout.strip() == "nodeb"
    net.partition(b)
    cut = a.run([PY, "-c", CONNECT, b.addr, "1"])
    assert cut.returncode != 0
    assert "timed out" in cut.stderr
    net.heal(b)


def test_close_kills_processes_and_removes_namespaces():
    with netns.host_network(2) as net:
        sleeper = net.hosts[0].popen([PY, "-c", "import time; time.sleep(600)"])
        namespaces = [h.ns for h in net.hosts] + [net.switch]
        # `ip netns exec` enters the namespace after it started: wait until the sleeper is in it
        deadline = time.monotonic() + 30
        while not net.hosts[0].pids():
            assert time.monotonic() < deadline, "the sleeper never entered its host's namespace"
            time.sleep(0.01)
    assert sleeper.poll() is not None
    left = netns.leftovers(os.getpid())
    assert left == []
    assert not set(namespaces) & set(netns._namespaces())
