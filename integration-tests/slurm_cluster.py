"""A real Slurm cluster on namespace hosts: one controller host, one ``slurmd`` per compute host.

Debian's ``slurmctld``, ``slurmd`` and ``munge`` (22.05) run as they would on a small cluster,
except that every "host" is a network namespace from :mod:`netns` on this machine:

- one ``munged`` with a private key and a socket in the cluster's folder, shared by every host
  (a Unix socket crosses network namespaces);
- ``slurmctld`` on the controller host (``ctl``), ``slurmd -N NAME`` on each compute host, each
  with its own host name that resolves to 127.0.0.1 on that host (as on many cloud images);
- ``ProctrackType=proctrack/linuxproc`` and ``TaskPlugin=task/none``: no cgroups are needed;
- ``%n`` (the node name) in slurmd's spool, pid and log paths, so the daemons share nothing.

Hosts are entered with ``nsenter --net`` plus ``unshare --uts --mount`` (own host name, own
``/etc/hosts`` bind-mounted), not ``ip netns exec``: that remounts ``/sys``, and slurmd 22.05 then
fails on ``/sys/fs/cgroup``. Everything lives in one temporary folder and is removed by
:meth:`SlurmCluster.close`, which kills every daemon and job process.

Used by the ``slurm`` fixture (``conftest.py``) and by hand through ``tools/slurm_cluster.py``.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import netns

__all__ = ["SLURM_COMMANDS", "SlurmCluster", "SlurmUnavailable", "slurm_cluster"]

#: The programs the cluster needs (Debian: ``apt-get install slurmctld slurmd slurm-client munge``).
SLURM_COMMANDS = ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "munged", "nsenter")


class SlurmUnavailable(RuntimeError):
    """The Slurm or munge programs are missing, or the cluster did not come up."""


def _enter(host: netns.Host, argv: Sequence[str]) -> list[str]:
    """``argv`` run inside ``host``: its network, its host name and its ``/etc/hosts``."""
    hosts_file = netns.NETNS_ETC / host.ns / "hosts"
    script = 'hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"'
    return [
        "nsenter",
        f"--net=/run/netns/{host.ns}",
        "unshare",
        "--uts",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        host.name,
        str(hosts_file),
        *argv,
    ]


class SlurmCluster:
    """A controller and ``compute`` slurmd hosts. Use :func:`slurm_cluster` (a context manager).

    Attributes:
        root: the folder holding the configuration, logs, spools and munge's socket.
        conf: the ``slurm.conf`` path (``SLURM_CONF`` for the client commands).
        controller: the controller's namespace host.
        nodes: the compute hosts, in node-list order (``node1``, ``node2``...).
    """

    def __init__(self, compute: int = 3, *, root: Path | None = None, partition: str = "debug") -> None:
        missing = [cmd for cmd in SLURM_COMMANDS if shutil.which(cmd) is None]
        if missing:
            raise SlurmUnavailable(
                f"missing {' '.join(missing)}: apt-get install -y slurmctld slurmd slurm-client munge"
            )
        names = ["ctl"] + [f"node{i + 1}" for i in range(compute)]
        self.partition = partition
        self.root = Path(tempfile.mkdtemp(prefix="rpslurm-", dir=root))
        self.conf = self.root / "slurm.conf"
        self.network = netns.HostNetwork(len(names), names=names)
        self.controller = self.network.hosts[0]
        self.nodes = list(self.network.hosts[1:])
        self._daemons: list[subprocess.Popen[Any]] = []
        self._munged_pid: int | None = None
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    # -- start -------------------------------------------------------------------------------

    def _start(self) -> None:
        self._start_munge()
        self._write_conf()
        log = self.root / "log"
        ctld = subprocess.Popen(
            _enter(self.controller, ["slurmctld", "-D", "-i", "-f", str(self.conf)]),
            stdout=open(log / "slurmctld.out", "wb"),  # noqa: SIM115 - kept by the daemon
            stderr=subprocess.STDOUT,
            env=self.environ(),
        )
        self.controller.procs.append(ctld)
        self._daemons.append(ctld)
        for node in self.nodes:
            proc = subprocess.Popen(
                _enter(node, ["slurmd", "-D", "-N", node.name, "-f", str(self.conf)]),
                stdout=open(log / f"{node.name}.out", "wb"),  # noqa: SIM115 - kept by the daemon
                stderr=subprocess.STDOUT,
                env=self.environ(),
            )
            node.procs.append(proc)
            self._daemons.append(proc)
        self._wait_idle(timeout=90)

    def _start_munge(self) -> None:
        munge = self.root / "munge"
        munge.mkdir(mode=0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        subprocess.run(
            [
                "munged",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--log-file={munge / 'munged.log'}",
                f"--seed-file={munge / 'munged.seed'}",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        self._munged_pid = int((munge / "munged.pid").read_text().split()[0])

    @property
    def munge_socket(self) -> Path:
        """munged's socket, shared by every host."""
        return self.root / "munge" / "munge.socket"

    def _write_conf(self) -> None:
        for sub in ("log", "state", "spool"):
            (self.root / sub).mkdir()
        lines = [
            "ClusterName=rallypoint",
            f"SlurmctldHost={self.controller.name}({self.controller.addr})",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"AuthInfo=socket={self.munge_socket}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "MessageTimeout=10",
            "KillWait=5",
            "InactiveLimit=0",
            "MinJobAge=300",
            "JobRequeue=1",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdSpoolDir={self.root / 'spool' / '%n'}",
            f"SlurmdPidFile={self.root / 'spool' / '%n.pid'}",
            f"SlurmdLogFile={self.root / 'log' / '%n.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        lines += [f"NodeName={n.name} NodeAddr={n.addr} CPUs=2 State=UNKNOWN" for n in self.nodes]
        names = ",".join(n.name for n in self.nodes)
        lines.append(f"PartitionName={self.partition} Nodes={names} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")

    def _wait_idle(self, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for proc in self._daemons:
                if proc.poll() is not None:
                    raise SlurmUnavailable(f"a Slurm daemon exited ({proc.returncode}): {self.logs_tail()}")
            out = self.client(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
            last = out.stdout.strip() + out.stderr.strip()
            states = dict(line.split() for line in out.stdout.splitlines() if len(line.split()) == 2)
            if out.returncode == 0 and len(states) == len(self.nodes) and set(states.values()) == {"idle"}:
                return
            time.sleep(0.1)
        raise SlurmUnavailable(f"the cluster did not come up in {timeout} s (sinfo: {last!r}): {self.logs_tail()}")

    # -- use ---------------------------------------------------------------------------------

    def environ(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for Slurm's commands and daemons (``SLURM_CONF`` set)."""
        env = netns.environ_for_hosts(os.environ)
        env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
        env["SLURM_CONF"] = str(self.conf)
        env.update(extra or {})
        return env

    def command(self, argv: Sequence[str], host: netns.Host | None = None) -> list[str]:
        """``argv`` wrapped to run on ``host`` (default: the controller)."""
        return _enter(host or self.controller, argv)

    def client(
        self,
        argv: Sequence[str],
        *,
        host: netns.Host | None = None,
        check: bool = True,
        timeout: float = 60,
        env: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (``sbatch``, ``scontrol``...) on ``host`` (default: the controller)."""
        proc = subprocess.run(
            self.command(argv, host),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=self.environ(env),
            **kwargs,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def sbatch(self, script: Path, *args: str, env: Mapping[str, str] | None = None) -> int:
        """Submit ``script``; the job id."""
        out = self.client(["sbatch", "--parsable", *args, str(script)], env=env)
        return int(out.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job`` as a dict (empty once the job is forgotten)."""
        out = self.client(["scontrol", "-o", "show", "job", str(job_id)], check=False)
        fields: dict[str, str] = {}
        for part in out.stdout.split():
            key, sep, value = part.partition("=")
            if sep:
                fields.setdefault(key, value)
        return fields

    def wait_state(self, job_id: int, states: Sequence[str], *, timeout: float = 60) -> str:
        """Wait until the job's ``JobState`` is one of ``states``; that state."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.job(job_id).get("JobState", "")
            if state in states:
                return state
            time.sleep(0.1)
        raise TimeoutError(f"job {job_id} still {state or 'unknown'} after {timeout} s, wanted {'/'.join(states)}")

    def logs_tail(self, lines: int = 15) -> str:
        """The last lines of every daemon log (for failure messages)."""
        parts = []
        for log in sorted((self.root / "log").glob("*")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(parts)

    # -- stop --------------------------------------------------------------------------------

    def close(self) -> set[int]:
        """Kill every daemon and job process, stop munged, remove the namespaces and the folder.

        Returns:
            the ids of the processes killed (the caller may check that none survived).
        """
        killed = self.network.close() if hasattr(self, "network") else set()
        if self._munged_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._munged_pid, 9)
            killed.add(self._munged_pid)
            deadline = time.monotonic() + 5
            while netns.process_alive(self._munged_pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            self._munged_pid = None
        shutil.rmtree(self.root, ignore_errors=True)
        return killed

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def slurm_cluster(compute: int = 3) -> Iterator[SlurmCluster]:
    """A Slurm cluster of ``compute`` nodes, torn down on exit whatever happened inside."""
    cluster = SlurmCluster(compute)
    try:
        yield cluster
    finally:
        cluster.close()
