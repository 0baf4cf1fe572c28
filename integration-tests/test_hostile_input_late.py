"""Hostile input that used to be found late: after start-up (exit 1), never (a hang), or misreported.

The second corpus of hostile input (issue #35), run like the first (``test_hostile_input.py``):
through ``rallypoint config check`` where it can see the problem, and through ``rallypoint run``,
each must exit 2 before anything starts, naming where the value came from and its key, with no
traceback and no "internal error".
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile import FILE, Case, config_check_refuses, env, flag, run_refuses, setting

GRPC = '[rendezvous]\nbackend = "grpc"\n[rendezvous.options]\nendpoint = "127.0.0.1:29400"\n'
FILE_BACKEND = '[rendezvous]\nbackend = "file"\n[rendezvous.options]\n'
ETCD = '[rendezvous]\nbackend = "etcd"\n[rendezvous.options]\n'
TLS_CA = "rendezvous.options.tls_ca"
PEM_FILE = "tls_ca must name a readable PEM file on every node"

CASES = [
    # a job file that is a named pipe: opening it waited for a writer for ever
    Case("job-file-fifo", FILE, "", "is a named pipe (FIFO)", "<fifo>", whole=True),
    # files and variables an option names are checked with the job (they were read after start-up:
    # "internal error ... This is a bug" for a TLS file, exit 1 for the others)
    Case("grpc-tls-ca-missing", FILE, TLS_CA, PEM_FILE, GRPC + 'tls_ca = "/nonexistent/ca.pem"\n'),
    Case("grpc-tls-ca-directory", FILE, TLS_CA, "the CA certificate . is a directory", GRPC + 'tls_ca = "."\n'),
    Case("grpc-tls-ca-not-pem", FILE, TLS_CA, "is not a PEM file", GRPC + 'tls_ca = "worker.py"\n'),
    Case(
        "grpc-token-file-missing",
        FILE,
        "rendezvous.options.token_file",
        "cannot read the token file /nonexistent/token",
        GRPC + 'token_file = "/nonexistent/token"\n',
    ),
    Case(
        "grpc-token-env-unset",
        FILE,
        "rendezvous.options.token_env",
        "the variable RP_HOSTILE_UNSET (token) is not set",
        GRPC + 'token_env = "RP_HOSTILE_UNSET"\n',
    ),
    Case(
        "rpc-tls-ca-directory",
        FILE,
        "rpc.options.tls_ca",
        "is a directory, not a file",
        '[rpc.options]\ntls_ca = "."\ntls_cert = "worker.py"\ntls_key = "worker.py"\n',
    ),
    Case(
        "etcd-endpoint-unclosed-bracket",
        FILE,
        "rendezvous.options.endpoints",
        "is not [IPv6]:PORT",
        ETCD + 'endpoints = ["http://[::1"]\n',
    ),
    Case(
        "etcd-tls-ca-missing",
        FILE,
        TLS_CA,
        "cannot read the CA bundle /nonexistent/ca.pem",
        ETCD + 'endpoints = ["https://127.0.0.1:2379"]\ntls_ca = "/nonexistent/ca.pem"\n',
    ),
    Case(
        "etcd-password-env-unset",
        FILE,
        "rendezvous.options.password_env",
        "the variable RP_HOSTILE_UNSET (etcd password of user 'rp') is not set",
        ETCD + 'username = "rp"\npassword_env = "RP_HOSTILE_UNSET"\n',
    ),
    # the file backend's path: empty (it used the current directory), or where no directory can be made
    Case("file-path-empty", FILE, "rendezvous.options.path", "the path is empty", FILE_BACKEND + 'path = ""\n'),
    Case(
        "file-path-proc-sys",
        FILE,
        "rendezvous.options.path",
        "cannot create a directory in /proc/sys",
        FILE_BACKEND + 'path = "/proc/sys"\n',
    ),
    # heartbeats of 1ms / 2ms were accepted: 22 rounds in 18 s, then the nodes disagreed on the outcome
    Case(
        "heartbeat-interval-1ms",
        FILE,
        "rendezvous.heartbeat_interval",
        "at least 100ms, got 1ms",
        '[rendezvous]\nheartbeat_interval = "1ms"\nheartbeat_timeout = "2ms"\n',
    ),
    Case(
        "heartbeat-timeout-2ms-set",
        setting("rendezvous.heartbeat_timeout"),
        "rendezvous.heartbeat_timeout",
        "at least 500ms, got 2ms",
        sets=('rendezvous.heartbeat_timeout="2ms"', 'rendezvous.heartbeat_interval="0.1s"'),
    ),
    # --local-addr "not an ip!" became MASTER_ADDR
    Case(
        "local-addr-flag",
        flag("--local-addr"),
        "",
        "invalid address 'not an ip!': give this node's IP address or host name",
        flags=("--local-addr", "not an ip!"),
        check=False,
    ),
    Case(
        "local-addr-rallypoint-env",
        "RALLYPOINT_LOCAL_ADDR (environment)",
        "",
        "invalid address '10.0.0.300'",
        env={"RALLYPOINT_LOCAL_ADDR": "10.0.0.300"},
        check=False,
    ),
    Case(
        "local-addr-env",
        "PET_LOCAL_ADDR (environment)",
        "",
        "invalid address 'a b'",
        env={"PET_LOCAL_ADDR": "a b"},
        check=False,
    ),
    # preload_keep keeps the warm process of preload: without preload it did nothing, silently
    Case(
        "preload-keep-alone-file",
        FILE,
        "agent.preload_keep",
        "preload names no module",
        '[agent]\npreload_keep = "10m"\n',
    ),
    Case(
        "preload-keep-alone-flag",
        flag("--preload-keep"),
        "agent.preload_keep",
        "preload names no module",
        flags=("--preload-keep", "10m"),
        check=False,
    ),
    Case(
        "preload-keep-alone-env",
        env("AGENT_PRELOAD_KEEP"),
        "agent.preload_keep",
        "preload names no module",
        env={"RALLYPOINT_AGENT_PRELOAD_KEEP": "1m"},
    ),
    # an argument larger than Linux passes: the worker failed to start with "check the entry point path"
    Case(
        "arg-900kb",
        FILE,
        "job.args[0]",
        "holds 900000 bytes; Linux passes at most 128 KiB in one argument",
        'args = ["' + "x" * 900_000 + '"]\n',
    ),
    Case("env-200kb", FILE, "job.env.BIG", "holds 200000 bytes", '[job.env]\nBIG = "' + "x" * 200_000 + '"\n'),
    # --nproc-per-node 10**20 was reported as "got 1025"
    Case(
        "nproc-flag-says-the-value",
        flag("--nproc-per-node"),
        "nodes.nproc_per_node",
        "at most 1024 workers per node, got 100000000000000000000",
        flags=("--nproc-per-node", str(10**20)),
        check=False,
    ),
    # an allow pattern that matches nothing ("") was accepted
    Case("rpc-allow-empty", FILE, "rpc.allow[0]", "'' is not a module pattern", '[rpc]\nallow = [""]\n'),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", [c for c in CASES if c.check], ids=lambda c: c.id)
def test_config_check_locates_the_problem(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config_check_refuses(case, tmp_path, monkeypatch, capsys)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_run_refuses_before_any_worker_starts(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_refuses(case, tmp_path, monkeypatch, capsys)
