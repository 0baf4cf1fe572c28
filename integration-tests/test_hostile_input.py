"""Hostile input: every bad job file, variable and flag ends in a located error, never a hang or a traceback.

A corpus of cases (issue #12). Each case is a job file (or something pretending to be one), some
``RALLYPOINT_*`` variables, ``--set`` overrides and ``rallypoint run`` flags. Every case is run
through ``rallypoint config check`` (where the problem is one config check can see) and through
``rallypoint run``, in process, and must:

- exit 2 (a usage or configuration error, not a failure of the job);
- print ``<source>: <key>`` (where the value came from: the file, the variable or the flag, and its
  key path) and a phrase of the explanation;
- print no traceback and no "internal error";
- for ``run``: start no worker (the worker script would leave a file behind).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hostile import FILE, JOB, RALLYPOINT, UNCREATABLE, Case, config_check_refuses, env, flag, run_refuses, setting

DEEP_TABLE = "[rendezvous.options]\nx = " + "{a = " * 600 + "1" + "}" * 600 + "\n"
DEEP_40 = "[rendezvous.options]\nx = " + "{a = " * 40 + "1" + "}" * 40 + "\n"
DEEP_LIST = "[" * 700 + "]" * 700
NPROC = "nodes.nproc_per_node"
RUN_ID = "rendezvous.run_id"
RUN_ID_RULE = "a run id is 1 to 128 ASCII letters, digits"
LOG_DIR = "agent.log_dir"
TEMPLATE = "is not a name the template knows"
NUL = "holds a NUL character"
TEE = "agent.tee"

CASES = [
    # counts are bounded, and the bound is said (nproc of 10**20 used to hang run at 100% CPU)
    Case(
        "nproc-1e20-file",
        FILE,
        NPROC,
        "at most 1024 workers per node",
        "[nodes]\nnproc_per_node = 100000000000000000000\n",
    ),
    Case(
        "nproc-2^63-file",
        FILE,
        NPROC,
        "at most 1024 workers per node",
        "[nodes]\nnproc_per_node = 9223372036854775807\n",
    ),
    Case(
        "nproc-env",
        env("NODES_NPROC_PER_NODE"),
        NPROC,
        "at most 1024",
        env={"RALLYPOINT_NODES_NPROC_PER_NODE": "9223372036854775807"},
    ),
    Case("nproc-set", setting(NPROC), NPROC, "at most 1024", sets=(f"{NPROC}=100000000000000000000",)),
    Case(
        "nproc-flag",
        flag("--nproc-per-node"),
        NPROC,
        "at most 1024",
        flags=("--nproc-per-node", "1" + "0" * 20),
        check=False,
    ),
    Case(
        "nproc-flag-5000-digits",
        flag("--nproc-per-node"),
        NPROC,
        "at most 1024",
        flags=("--nproc-per-node", "9" * 5000),
        check=False,
    ),
    Case(
        "nproc-flag-superscript",
        flag("--nproc-per-node"),
        NPROC,
        "positive number of workers",
        flags=("--nproc-per-node", "²"),
        check=False,
    ),
    Case("nproc-zero-string", setting(NPROC), NPROC, "positive number", sets=(f'{NPROC}="0"',)),
    Case("nodes-min-file", FILE, "nodes.min", "at most 65536", "[nodes]\nmin = 1000000\n"),
    Case("nodes-max-env", env("NODES_MAX"), "nodes.max", "at most 65536", env={"RALLYPOINT_NODES_MAX": "70000"}),
    Case("nnodes-flag", flag("--nnodes"), "nodes.max", "at most 65536", flags=("--nnodes", "1:70000"), check=False),
    Case(
        "nnodes-flag-huge",
        flag("--nnodes"),
        "nodes",
        "expected N or MIN:MAX",
        flags=("--nnodes", "9" * 5000),
        check=False,
    ),
    Case("max-restarts-file", FILE, "agent.max_restarts", "at most 100000", "[agent]\nmax_restarts = 1000000000\n"),
    Case(
        "max-restarts-flag",
        flag("--max-restarts"),
        "agent.max_restarts",
        "at most 100000",
        flags=("--max-restarts", "10" * 9),
        check=False,
    ),
    Case(
        "max-restarts-env",
        env("AGENT_MAX_RESTARTS"),
        "agent.max_restarts",
        "at least 0",
        env={"RALLYPOINT_AGENT_MAX_RESTARTS": "-1"},
    ),
    Case(
        "join-timeout-huge-file",
        FILE,
        "rendezvous.join_timeout",
        "at most 365d",
        "[rendezvous]\njoin_timeout = " + "9" * 4000 + "\n",
    ),
    Case(
        "join-timeout-env",
        env("RENDEZVOUS_JOIN_TIMEOUT"),
        "rendezvous.join_timeout",
        "at most 365d",
        env={"RALLYPOINT_RENDEZVOUS_JOIN_TIMEOUT": "9999d"},
    ),
    Case(
        "monitor-interval-flag-inf",
        flag("--monitor-interval"),
        "agent.monitor_interval",
        "finite",
        flags=("--monitor-interval", "1e400"),
        check=False,
    ),
    Case(
        "collectives-timeout-set",
        setting("collectives.timeout"),
        "collectives.timeout",
        "at most 365d",
        sets=('collectives.timeout="400d"',),
    ),
    Case("tee-rank-huge", FILE, TEE, "ranks are below", "[agent]\ntee = [1000000000000]\n"),
    Case(
        "store-head-start-set",
        setting("agent.store_head_start"),
        "agent.store_head_start",
        "at most 1m, got 365d",
        sets=('agent.store_head_start="365d"',),
    ),
    Case(
        "monitor-interval-flag-hour",
        flag("--monitor-interval"),
        "agent.monitor_interval",
        "at most 1m, got 1h",
        flags=("--monitor-interval", "1h"),
        check=False,
    ),
    Case(
        "nproc-auto-5000-gpus",
        flag("--nproc-per-node"),
        NPROC,
        '"auto" found 5000 GPUs',
        flags=("--nproc-per-node", "auto"),
        env={"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(5000)))},
        check=False,
    ),
    Case(
        "labels-file-dev-zero",
        "invalid node labels in /dev/zero",
        "'/dev/zero'",
        "larger than 64 KiB",
        env={"RALLYPOINT_NODE_LABELS_FILE": "/dev/zero"},
        check=False,
    ),
    # what is read is bounded: depth, size, devices, numbers
    Case("deep-inline-table", FILE, "", "nest more than 32 levels", JOB + DEEP_TABLE, whole=True),
    Case("deep-40", FILE, "rendezvous.options.x.a.a", "nest more than 32 levels", DEEP_40),
    Case(
        "deep-env",
        env("RENDEZVOUS_OPTIONS_X"),
        "rendezvous.options.x",
        "nest more than 32",
        env={"RALLYPOINT_RENDEZVOUS_OPTIONS_X": DEEP_LIST},
    ),
    Case(
        "deep-set",
        setting("rendezvous.options.x"),
        "rendezvous.options.x",
        "nest more than 32",
        sets=(f"rendezvous.options.x={DEEP_LIST}",),
    ),
    Case("dev-zero", FILE, "", "is a device or socket", "<zero>", whole=True),
    Case("two-mib", FILE, "", "larger than 1024 KiB", "<big>", whole=True),
    Case("5000-digit-int", FILE, "", "more than 4300 digits", JOB + "[nodes]\nmin = " + "9" * 5000 + "\n", whole=True),
    Case("not-utf8", FILE, "", "is not UTF-8", '[job]\nname = "\xff"\n<latin1>', whole=True),
    Case("invalid-toml", FILE, "", "invalid TOML", JOB + "[nodes\n", whole=True),
    # the log directory template
    Case("log-dir-unclosed", FILE, LOG_DIR, "cannot read the template", '[agent]\nlog_dir = "{foo"\n'),
    Case(
        "log-dir-attribute-flag", flag("--log-dir"), LOG_DIR, TEMPLATE, flags=("--log-dir", "{run_id.x}"), check=False
    ),
    Case("log-dir-index-env", env("AGENT_LOG_DIR"), LOG_DIR, TEMPLATE, env={"RALLYPOINT_AGENT_LOG_DIR": "{0}"}),
    Case("log-dir-conversion-set", setting(LOG_DIR), LOG_DIR, TEMPLATE, sets=('agent.log_dir="runs/{run_id!r}"',)),
    Case("log-dir-huge-spec", FILE, LOG_DIR, TEMPLATE, '[agent]\nlog_dir = "{job:>99999999999}"\n'),
    Case("log-dir-unknown-name", FILE, LOG_DIR, TEMPLATE, '[agent]\nlog_dir = "runs/{user}"\n'),
    Case("log-dir-empty", FILE, LOG_DIR, "is empty", '[agent]\nlog_dir = " "\n'),
    Case("log-dir-nul", setting(LOG_DIR), LOG_DIR, NUL, sets=('agent.log_dir="a\\u0000b"',)),
    # a log directory that cannot be written is refused before any worker starts
    Case(
        "log-dir-under-a-file",
        flag("--log-dir"),
        LOG_DIR,
        "cannot be created",
        flags=("--log-dir", "worker.py/logs"),
        check=False,
    ),
    Case(
        "log-dir-not-permitted",
        flag("--log-dir"),
        LOG_DIR,
        "cannot be created",
        flags=("--log-dir", UNCREATABLE),
        check=False,
    ),
    Case(
        "log-dir-not-permitted-file",
        FILE,
        LOG_DIR,
        "give one you can write",
        f'[agent]\nlog_dir = "{UNCREATABLE}"\n',
        check=False,
    ),
    # a path option never deletes what is there (the file watchdog replaced anything at its path: /dev/zero went)
    Case(
        "watchdog-fifo-over-a-file",
        setting("timer.options.path"),
        "timer.options.path",
        "exists and is not a FIFO",
        sets=("timer.watchdog=file", 'timer.options.path="worker.py"'),
    ),
    # run ids: an alphabet and a length
    Case("run-id-dotdot-file", FILE, RUN_ID, RUN_ID_RULE, '[rendezvous]\nrun_id = "../../x"\n'),
    Case("run-id-dotdot-flag", flag("--run-id"), RUN_ID, RUN_ID_RULE, flags=("--run-id", "../../x"), check=False),
    Case("run-id-empty-flag", flag("--run-id"), RUN_ID, RUN_ID_RULE, flags=("--run-id", ""), check=False),
    Case("run-id-empty-env", env("RENDEZVOUS_RUN_ID"), RUN_ID, RUN_ID_RULE, env={"RALLYPOINT_RENDEZVOUS_RUN_ID": '""'}),
    Case("run-id-slash-set", setting(RUN_ID), RUN_ID, RUN_ID_RULE, sets=('rendezvous.run_id="a/b"',)),
    Case("run-id-dotdot-alone", FILE, RUN_ID, RUN_ID_RULE, '[rendezvous]\nrun_id = ".."\n'),
    Case("run-id-too-long", FILE, RUN_ID, RUN_ID_RULE, f'[rendezvous]\nrun_id = "{"r" * 129}"\n'),
    Case("run-id-space", FILE, RUN_ID, RUN_ID_RULE, '[rendezvous]\nrun_id = "a b"\n'),
    Case("run-id-unicode", FILE, RUN_ID, RUN_ID_RULE, '[rendezvous]\nrun_id = "é"\n'),
    Case("run-id-leading-dash", setting(RUN_ID), RUN_ID, RUN_ID_RULE, sets=("rendezvous.run_id=-rf",)),
    Case("job-name-dotdot-set", setting("job.name"), "job.name", "invalid job name", sets=('job.name="../../x"',)),
    Case("job-name-slash-file", FILE, "job.name", "part of the run id", 'name = "a/b"\n'),
    # node ids and host names name the node in rendezvous keys
    Case(
        "node-id-dotdot-flag", flag("--node-id"), "", "invalid node id '../x'", flags=("--node-id", "../x"), check=False
    ),
    Case("node-id-space-flag", flag("--node-id"), "", "invalid node id", flags=("--node-id", "a b"), check=False),
    Case("node-id-env", env("NODE_ID"), "", "invalid node id", env={"RALLYPOINT_NODE_ID": "x y"}, check=False),
    Case(
        "host-name-space-flag", flag("--host-name"), "", "invalid host name", flags=("--host-name", "a b"), check=False
    ),
    Case(
        "host-name-unicode-env",
        env("HOST_NAME"),
        "",
        "invalid host name",
        env={"RALLYPOINT_HOST_NAME": "é"},
        check=False,
    ),
    Case("module-empty-flag", flag("SCRIPT"), "job.module", "is empty", flags=("-m", ""), check=False),
    Case("entrypoint-blank-set", setting("job.entrypoint"), "job.entrypoint", "is empty", sets=('job.entrypoint=" "',)),
    # NUL bytes cannot reach a command line or an environment
    Case("nul-env-file", FILE, "job.env.A", NUL, '[job.env]\nA = "x\\u0000y"\n'),
    Case("nul-args-file", FILE, "job.args[1]", NUL, 'args = ["a", "b\\u0000"]\n'),
    Case("nul-args-env", env("JOB_ARGS"), "job.args[0]", NUL, env={"RALLYPOINT_JOB_ARGS": '["\\u0000"]'}),
    Case("nul-env-set", setting("job.env"), "job.env.B", NUL, sets=('job.env={B = "\\u0000"}',)),
    Case(
        "nul-entrypoint-set", setting("job.entrypoint"), "job.entrypoint", NUL, sets=('job.entrypoint="w\\u0000.py"',)
    ),
    Case(
        "nul-plugin-option",
        setting("rendezvous.options.path"),
        "rendezvous.options.path",
        NUL,
        sets=("rendezvous.backend=file", 'rendezvous.options.path="a\\u0000b"'),
    ),
    Case("nul-in-a-key", FILE, "ranks.options.a\\0", NUL, '[ranks.options]\n"a\\u0000" = 1\n'),
    Case(
        "watchdog-path-empty",
        setting("timer.options.path"),
        "timer.options.path",
        "is empty",
        sets=("timer.watchdog=file", 'timer.options.path=""'),
    ),
    Case("env-name-equals", FILE, "job.env.A=B", "invalid variable name", '[job.env]\n"A=B" = "x"\n'),
    Case("env-name-empty", FILE, "job.env", "invalid variable name", '[job.env]\n"" = "x"\n'),
    # --tee: torchrun's stream numbers are translated (3) or refused with the reason
    Case("tee-commas-flag", flag("--tee"), TEE, 'expected "all"', flags=("--tee", ",,,"), check=False),
    Case("tee-0-flag", flag("--tee"), TEE, "torchrun's --tee 0", flags=("--tee", "0"), check=False),
    Case("tee-1-flag", flag("--tee"), TEE, "torchrun's --tee 1", flags=("--tee", "1"), check=False),
    Case("tee-2-flag", flag("--tee"), TEE, "torchrun's --tee 2", flags=("--tee", "2"), check=False),
    Case("tee-local-rank-map", flag("--tee"), TEE, "per-local-rank form", flags=("--tee", "0:3,1:2"), check=False),
    Case("tee-double-comma", flag("--tee"), TEE, 'expected "all"', flags=("--tee", "0,,3"), check=False),
    Case("tee-word-file", FILE, TEE, 'expected "all"', '[agent]\ntee = "rank1"\n'),
    Case("tee-commas-set", setting(TEE), TEE, 'expected "all"', sets=('agent.tee=",,,"',)),
    Case("tee-commas-env", env("AGENT_TEE"), TEE, 'expected "all"', env={"RALLYPOINT_AGENT_TEE": ",,"}),
    # every error names where the value came from, not the defaults or the file
    Case(
        "range-flag",
        flag("--nnodes"),
        "nodes.max",
        "max (2) is smaller than min (3)",
        flags=("--nnodes", "3:2"),
        check=False,
    ),
    Case(
        "range-env",
        env("NODES_MAX"),
        "nodes.max",
        "(nodes.min from job.toml)",
        "[nodes]\nmin = 2\n",
        env={"RALLYPOINT_NODES_MAX": "1"},
    ),
    Case(
        "range-set", setting("nodes.max"), "nodes.max", "smaller than min", "[nodes]\nmin = 2\n", sets=("nodes.max=1",)
    ),
    Case(
        "heartbeat-env",
        env("RENDEZVOUS_HEARTBEAT_INTERVAL"),
        "rendezvous.heartbeat_interval",
        "must be longer",
        env={"RALLYPOINT_RENDEZVOUS_HEARTBEAT_INTERVAL": "1h"},
    ),
    Case(
        "heartbeat-set",
        setting("rendezvous.heartbeat_timeout"),
        "rendezvous.heartbeat_timeout",
        "must be longer",
        sets=('rendezvous.heartbeat_timeout="1s"',),
    ),
    Case(
        "module-env",
        env("JOB_MODULE"),
        "job.module",
        "(job.entrypoint from job.toml)",
        env={"RALLYPOINT_JOB_MODULE": "x"},
    ),
    Case(
        "backend-flag-no-endpoint",
        flag("--rdzv-backend"),
        "rendezvous.options.path",
        "required key is missing",
        flags=("--rdzv-backend", "file"),
        check=False,
    ),
    Case(
        "backend-env-no-endpoint",
        env("RENDEZVOUS_BACKEND"),
        "rendezvous.options.path",
        "required key is missing",
        env={"RALLYPOINT_RENDEZVOUS_BACKEND": "file"},
    ),
    Case(
        "backend-unknown-with-endpoint",
        flag("--rdzv-backend"),
        "rendezvous.backend",
        "unknown rendezvous backend",
        flags=("--rdzv-backend", "nosuch", "--rdzv-endpoint", "x"),
        check=False,
    ),
    Case("set-empty-key-parts", setting(".."), "..", "no empty parts", sets=("..=1",)),
    Case("set-below-a-number", setting("nodes.min.x"), "nodes.min", "expected an integer", sets=("nodes.min.x=1",)),
    Case(
        "memory-multi-node-flag",
        flag("--nnodes"),
        "nodes.max",
        "only works within one agent process",
        flags=("--nnodes", "2:4"),
        check=False,
    ),
    Case(
        "memory-multi-node-env",
        env("NODES_MAX"),
        "nodes.max",
        "only works within one agent process",
        env={"RALLYPOINT_NODES_MAX": "3"},
        check=False,
    ),
    Case(
        "no-run-id-multi-node",
        flag("--nnodes"),
        RUN_ID,
        "needs a run id",
        flags=("--nnodes", "2:4", "--rdzv-backend", "file", "--rdzv-endpoint", "rdzv"),
        check=False,
    ),
]


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


def test_the_corpus_is_large_enough() -> None:
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)


def test_status_refuses_a_run_id_that_leaves_the_directory(tmp_path: Path) -> None:
    rdzv = tmp_path / "rdzv"
    result = subprocess.run(
        [*RALLYPOINT, "status", "--rdzv-backend", "file", "--rdzv-endpoint", str(rdzv), "--run-id", "../.."],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert f"{flag('--run-id')}: {RUN_ID}: invalid run id '../..'" in result.stderr
    assert "Traceback" not in result.stderr
    assert "internal error" not in result.stderr


@pytest.mark.parametrize(
    ("tee", "shown"),
    [("3", "all"), ("3,", "[3]"), ("0,3", "[0, 3]"), ("rank0", "rank0"), ("7", "[7]")],
)
def test_tee_on_the_command_line(tee: str, shown: str, tmp_path: Path) -> None:
    """torchrun's --tee 3 (both streams) is every rank's output; ranks are still written as lists."""
    from rallypoint.agent.config import AgentSection

    assert str(AgentSection.model_validate({"tee": tee}).tee).replace("'", "") == shown.replace("'", "")


def test_run_with_torchrun_tee_3_shows_the_worker(tmp_path: Path) -> None:
    """A one-worker job with torchrun's --tee 3 used to show nothing at all (read as rank 3 only)."""
    (tmp_path / "hello.py").write_text("print('hello from the worker', flush=True)\n")
    result = subprocess.run(
        [*RALLYPOINT, "run", "--tee", "3", "--log-dir", str(tmp_path / "logs"), "hello.py"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "hello from the worker" in result.stdout + result.stderr


def test_the_console_script_exits_2_for_a_hostile_file(tmp_path: Path) -> None:
    """The real process (not only main()) ends with status 2 and the located error."""
    (tmp_path / FILE).symlink_to("/dev/zero")
    for command in (["config", "check", FILE], ["run", FILE]):
        result = subprocess.run([*RALLYPOINT, *command], capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert f"{FILE}: is a device or socket" in result.stderr
        assert "Traceback" not in result.stderr
