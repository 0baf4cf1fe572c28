"""Several "hosts" on one machine: Linux network namespaces on a private bridge.

Each :class:`Host` is a network namespace with its own address on a bridge (``10.88.N.11``,
``.12``...), its own loopback, and, for the processes started through :meth:`Host.popen`, its own
host name (a UTS namespace) and ``/etc/hosts``. As on many cloud images, a host's own name
resolves to 127.0.0.1 there, while the other hosts' names resolve to their bridge addresses: the
case where a launcher that trusts ``gethostbyname(gethostname())`` breaks.

The bridge lives in a namespace of its own (the "switch"), so nothing is added to the machine's
own network. :meth:`HostNetwork.partition` takes a host's link down and :meth:`HostNetwork.heal`
brings it back. :meth:`HostNetwork.close` kills every process left in the namespaces and deletes
them; :func:`leftovers` lists what a test run left behind (the tests check it is nothing).

Needs root (``ip netns add``). Used by ``integration-tests`` through the ``hosts`` fixture
(``conftest.py``) and by hand through ``tools/netns_hosts.py``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Host", "HostNetwork", "NetnsUnavailable", "host_network", "leftovers", "process_alive", "sweep_stale"]

#: Every namespace this module creates starts with this, then the creating process id.
PREFIX = "rpnet"
NETNS_ETC = Path("/etc/netns")


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be created here (not root, no ``ip``, no kernel support)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _namespaces() -> list[str]:
    proc = _ip("netns", "list", check=False)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Host:
    """One namespace host.

    Attributes:
        name: its host name (what ``hostname`` prints inside).
        ns: the network namespace's name.
        addr: its address on the bridge.
        veth: the name of its link's switch end (taken down to cut it off).
    """

    name: str
    ns: str
    addr: str
    veth: str
    procs: list[subprocess.Popen[Any]] = field(default_factory=list, repr=False)

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside this host (its network, host name and ``/etc/hosts``)."""
        return [
            "ip",
            "netns",
            "exec",
            self.ns,
            "unshare",
            "--uts",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            self.name,
            *argv,
        ]

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside this host; it is killed when the network is closed."""
        proc = subprocess.Popen(self.command(argv), **kwargs)
        self.procs.append(proc)
        return proc

    def run(self, argv: Sequence[str], *, timeout: float = 60, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside this host to completion (text output captured)."""
        kwargs.setdefault("capture_output", True)
        return subprocess.run(self.command(argv), timeout=timeout, text=True, check=False, **kwargs)

    def pids(self) -> list[int]:
        """Every process running in this host's network namespace."""
        proc = _ip("netns", "pids", self.ns, check=False)
        return [int(p) for p in proc.stdout.split() if p.isdigit()]


class HostNetwork:
    """``count`` hosts on one bridge. Use :func:`host_network` (a context manager)."""

    def __init__(self, count: int, *, names: Sequence[str] | None = None, subnet: int | None = None) -> None:
        if shutil.which("ip") is None:
            raise NetnsUnavailable("the 'ip' command (iproute2) is not installed: apt-get install iproute2")
        if os.geteuid() != 0:
            raise NetnsUnavailable("creating network namespaces needs root (ip netns add)")
        self.tag = f"{PREFIX}{os.getpid()}x{_next_serial()}"
        # every network has its own bridge in its own namespace: addresses never clash between networks
        self.subnet = subnet if subnet is not None else 0
        self.switch = f"{self.tag}sw"
        self.hosts: list[Host] = []
        names = list(names) if names else [f"node{chr(ord('a') + i)}" for i in range(count)]
        if len(names) != count:
            raise ValueError(f"{count} hosts but {len(names)} names")
        try:
            self._build(names)
        except BaseException:
            self.close()
            raise

    def _build(self, names: list[str]) -> None:
        try:
            _ip("netns", "add", self.switch)
        except RuntimeError as exc:
            raise NetnsUnavailable(str(exc)) from None
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, name in enumerate(names):
            ns = f"{self.tag}h{i}"
            veth = f"v{i}"
            addr = f"10.88.{self.subnet}.{11 + i}"
            _ip("netns", "add", ns)
            # both ends are made in the host's namespace, then one end moves to the switch
            _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", veth)
            _ip("-n", ns, "link", "set", veth, "netns", self.switch)
            _ip("-n", self.switch, "link", "set", veth, "master", "br0")
            _ip("-n", self.switch, "link", "set", veth, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            self.hosts.append(Host(name, ns, addr, veth))
        for host in self.hosts:
            self._write_etc(host)

    def _write_etc(self, host: Host) -> None:
        """``/etc/netns/NS/hosts`` (``ip netns exec`` mounts it over ``/etc/hosts``)."""
        etc = NETNS_ETC / host.ns
        etc.mkdir(parents=True, exist_ok=True)
        lines = [f"127.0.0.1 localhost {host.name}", "::1 localhost ip6-localhost"]
        lines += [f"{other.addr} {other.name}" for other in self.hosts if other is not host]
        (etc / "hosts").write_text("\n".join(lines) + "\n")
        (etc / "hostname").write_text(host.name + "\n")

    def partition(self, host: Host) -> None:
        """Cut ``host`` off the bridge (its link goes down; packets are dropped, not refused)."""
        _ip("-n", self.switch, "link", "set", host.veth, "down")

    def heal(self, host: Host) -> None:
        """Put ``host`` back on the bridge."""
        _ip("-n", self.switch, "link", "set", host.veth, "up")

    def kill(self, host: Host) -> None:
        """SIGKILL every process on ``host`` at once, as when the host loses power (it stays usable)."""
        _kill_namespace_processes(host.ns)
        for proc in host.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)

    def close(self) -> set[int]:
        """Kill every process in the hosts, delete the namespaces and their ``/etc/netns`` files.

        Returns:
            the ids of the processes killed (the caller may check that none survived).
        """
        killed: set[int] = set()
        for host in self.hosts:
            for proc in host.procs:
                killed.add(proc.pid)
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
            killed |= _kill_namespace_processes(host.ns)
            for proc in host.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
        for ns in [h.ns for h in self.hosts] + [self.switch]:
            _delete_namespace(ns)
        self.hosts = []
        return killed

    def __enter__(self) -> HostNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_serial = 0


def _next_serial() -> int:
    global _serial
    _serial += 1
    return _serial


def _kill_namespace_processes(ns: str) -> set[int]:
    """SIGKILL every process in ``ns`` until none is left (10 s at most); the ids killed."""
    killed: set[int] = set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split() if p.isdigit()]
        pids = [pid for pid in pids if process_alive(pid)]  # zombies wait for their parent
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed.update(pids)
        time.sleep(0.05)
    return killed


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead and not yet reaped, does not)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return fields[0] not in ("Z", "X")


def _delete_namespace(ns: str) -> None:
    if ns in _namespaces():
        _kill_namespace_processes(ns)
        _ip("netns", "delete", ns, check=False)
    shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)


@contextlib.contextmanager
def host_network(count: int, *, names: Sequence[str] | None = None) -> Iterator[HostNetwork]:
    """``count`` namespace hosts, torn down on exit whatever happened inside."""
    network = HostNetwork(count, names=names)
    try:
        yield network
    finally:
        network.close()


def leftovers(pid: int | None = None) -> list[str]:
    """Namespaces (and ``/etc/netns`` folders) this module created and nobody deleted.

    Args:
        pid: only those created by this process id; default: all of them.
    """
    prefix = f"{PREFIX}{pid}x" if pid is not None else PREFIX
    found = [ns for ns in _namespaces() if ns.startswith(prefix)]
    if NETNS_ETC.is_dir():
        found += [f"/etc/netns/{p.name}" for p in NETNS_ETC.iterdir() if p.name.startswith(prefix)]
    return sorted(set(found))


def sweep_stale() -> list[str]:
    """Delete namespaces left by processes that no longer exist (a run killed with SIGKILL)."""
    removed = []
    for ns in leftovers():
        name = ns.rsplit("/", 1)[-1]
        digits = name[len(PREFIX) :].split("x", 1)[0]
        if digits.isdigit() and not _pid_alive(int(digits)):
            _delete_namespace(name)
            removed.append(name)
    return removed


def environ_for_hosts(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` without variables that would make processes in a host talk to the real machine."""
    drop = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "no_proxy", "NO_PROXY")
    return {k: v for k, v in base.items() if k not in drop}
