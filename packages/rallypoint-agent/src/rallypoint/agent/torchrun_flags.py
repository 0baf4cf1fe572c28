"""torchrun's command line on ``rallypoint run``: every torchrun flag, mapped onto the job or refused.

Each flag of torchrun (both spellings, ``--nproc-per-node`` and ``--nproc_per_node``) is a
:class:`TorchrunFlag`. A flag is either **mapped**: its value becomes overrides of job keys, whose
source is the flag (``rallypoint run --dry-run`` and the failure messages name it), or
**refused** when it makes no sense here, with a message that says why and what to use instead.
A few flags are **accepted without effect** because they have none in torchrun either for a
script (``--start-method``), or because they keep torchrun's default (``--event-log-handler null``).

Static rendezvous (``--node-rank`` with ``--master-addr``/``--master-port``, or
``--rdzv-backend static``) becomes the ``grpc`` backend at ``MASTER_ADDR:MASTER_PORT``: the agent
on that host serves it, the others connect. Node ``N`` gets group rank ``N`` through the ``env``
rank strategy (the node publishes ``RANK=N`` and ``WORLD_SIZE=NNODES``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import click

__all__ = [
    "STATIC_ENV",
    "TORCHRUN_FLAGS",
    "TorchrunFlag",
    "TorchrunRefused",
    "endpoint_value",
    "from_environment",
    "is_static",
    "static_node_env",
    "torchrun_options",
    "torchrun_overrides",
]

_FLAG = "(command line)"
#: torchrun's port of the c10d rendezvous when the endpoint has none.
C10D_PORT = 29400
#: torchrun's ``--master-port`` default.
MASTER_PORT = 29500
#: The backends torchrun names, as rallypoint's.
_BACKEND_ALIASES = {"c10d": "grpc", "etcd-v2": "etcd"}
#: ``--rdzv-conf`` keys that are ``[rendezvous]`` keys here.
_RDZV_CONF_KEYS = {
    "join_timeout": "rendezvous.join_timeout",
    "timeout": "rendezvous.join_timeout",
    "last_call_timeout": "rendezvous.last_call_timeout",
    "close_timeout": "rendezvous.close_timeout",
    "keep_alive_interval": "rendezvous.heartbeat_interval",
    # accepted by the torch RendezvousHandler adapter (rallypoint.rendezvous.torch_compat) too
    "heartbeat_interval": "rendezvous.heartbeat_interval",
    "heartbeat_timeout": "rendezvous.heartbeat_timeout",
}
#: torchrun's variable for the shutdown timeout, read when ``--shutdown-timeout`` is not given.
SHUTDOWN_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
#: What the node publishes for the ``env`` rank strategy under static rendezvous.
STATIC_ENV = ("RANK", "WORLD_SIZE")

Override = tuple[str, Any, str]


class TorchrunRefused(click.UsageError):
    """A torchrun flag (or value) that rallypoint does not take, with the reason and the alternative."""


@dataclass(frozen=True)
class TorchrunFlag:
    """One torchrun flag as ``rallypoint run`` takes it.

    Attributes:
        names: every spelling (``-r``, ``--redirects``; ``--nproc-per-node``, ``--nproc_per_node``).
        dest: the parameter name.
        help: the ``--help`` line, saying how it maps (and where the default differs).
        is_flag: takes no value.
        refused: why rallypoint refuses it, and what to use instead; ``None`` when it is accepted.
        keep_default: a value that is accepted although the flag is otherwise refused
            (torchrun's default, which changes nothing).
        metavar: the value's placeholder in ``--help``.
    """

    names: tuple[str, ...]
    dest: str
    help: str
    is_flag: bool = False
    refused: str | None = None
    keep_default: str | None = None
    metavar: str = "VALUE"

    @property
    def name(self) -> str:
        """The long dash spelling, e.g. ``--nproc-per-node``."""
        return next(n for n in self.names if n.startswith("--") and "_" not in n)


def _f(name: str, help: str, *, short: str | None = None, **kw: Any) -> TorchrunFlag:
    names = ([short] if short else []) + [name]
    if "-" in name[2:]:
        names.append("--" + name[2:].replace("-", "_"))
    return TorchrunFlag(tuple(names), name[2:].replace("-", "_"), help, **kw)


#: Every flag of torchrun 2.13 (the test derives the list from ``torchrun --help`` and checks it is this one).
TORCHRUN_FLAGS: tuple[TorchrunFlag, ...] = (
    _f("--nnodes", "Nodes, or an elastic range MIN:MAX (nodes.min/max).", metavar="N|MIN:MAX"),
    _f(
        "--nproc-per-node",
        "Workers on this node (nodes.nproc_per_node): a number, auto (GPUs, else CPUs), gpu or cpu.",
        metavar="N|auto|gpu|cpu",
    ),
    _f(
        "--rdzv-backend",
        "Rendezvous backend (rendezvous.backend); torchrun's c10d is grpc here, etcd-v2 is etcd, static is "
        "--node-rank/--master-addr. Default: memory for one node.",
        metavar="NAME",
    ),
    _f("--rdzv-endpoint", "Backend endpoint: HOST[:PORT] for grpc/c10d and etcd, a directory for file.", metavar="EP"),
    _f("--rdzv-id", "Run id shared by every node (rendezvous.run_id); also --run-id.", metavar="ID"),
    _f(
        "--rdzv-conf",
        "K=V,... : join/last_call/close timeouts, keep_alive_interval and heartbeat_interval/heartbeat_timeout, "
        "is_host, read_timeout; other keys are backend options (rendezvous.options.KEY).",
        metavar="K=V,...",
    ),
    _f("--standalone", "Single node, in-process rendezvous (backend memory).", is_flag=True),
    _f(
        "--max-restarts",
        "Job-wide restart budget (agent.max_restarts). Default 3 here, 0 in torchrun.",
        metavar="N",
    ),
    _f(
        "--monitor-interval",
        "Seconds between checks of workers and rendezvous (agent.monitor_interval).",
        metavar="SECONDS",
    ),
    _f(
        "--start-method",
        "Accepted, no effect: torchrun applies it to function launches only; scripts start as processes.",
        metavar="spawn|fork|forkserver",
    ),
    _f(
        "--event-log-handler",
        "Only 'null' (torchrun's default): rallypoint emits no torchelastic events.",
        refused="rallypoint does not emit torchelastic events, so there is no handler to select; watch the job "
        "with `rallypoint status --watch` (or --json), or write a plugin implementing the rallypoint_agent_* "
        "hooks",
        keep_default="null",
        metavar="NAME",
    ),
    _f("--role", "The workers' ROLE_NAME (agent.role); the same on every node of a job.", metavar="ROLE"),
    _f("--module", "Run SCRIPT as a Python module (python -m).", short="-m", is_flag=True),
    _f(
        "--no-python",
        "Run SCRIPT as a command, not with Python (commands that are not .py files already are).",
        is_flag=True,
    ),
    _f(
        "--run-path",
        "Refused: workers are processes of their own.",
        is_flag=True,
        refused="workers never run inside the launcher's interpreter here; drop --run-path: each worker runs "
        "the script with the same Python interpreter as rallypoint (python -u SCRIPT)",
    ),
    _f(
        "--log-dir",
        "Logs, error files and failure.json (agent.log_dir, a template with {run_id}, {job}). Default "
        "runs/{run_id}; torchrun writes to a temporary directory.",
        metavar="DIR",
    ),
    _f(
        "--redirects",
        "3: workers' output to the log files only (agent.tee = none); 0: no change.",
        short="-r",
        metavar="0|3",
    ),
    _f(
        "--tee",
        "Which ranks reach the console (agent.tee): all, rank0, none, R,R, or torchrun's 3.",
        short="-t",
        metavar="all|rank0|none|R,R|3",
    ),
    _f(
        "--local-ranks-filter",
        "Refused: the console is selected by global rank.",
        refused="the console is selected by global rank here; use --tee R,R (e.g. --tee 0,1), or --tee rank0",
        metavar="R,R",
    ),
    _f(
        "--duplicate-stdout-filters",
        "Refused: every line is in the log files.",
        refused="every worker line is kept in the log directory (agent.log_dir); filter those files "
        "(e.g. grep -h PATTERN runs/RUN_ID/attempt_*/rank_*.log) instead",
        metavar="FILTERS",
    ),
    _f(
        "--duplicate-stderr-filters",
        "Refused: every line is in the log files.",
        refused="every worker line is kept in the log directory (agent.log_dir); filter those files "
        "(e.g. grep -h PATTERN runs/RUN_ID/attempt_*/rank_*.log) instead",
        metavar="FILTERS",
    ),
    _f("--node-rank", "Static rendezvous: this node's group rank (needs a fixed --nnodes).", metavar="N"),
    _f("--master-addr", "Static rendezvous: the host of node rank 0; it serves the grpc rendezvous.", metavar="ADDR"),
    _f("--master-port", "Static rendezvous: its port (default 29500).", metavar="PORT"),
    _f(
        "--local-addr",
        "Address other nodes reach this node at (default: host name; 127.0.0.1 for memory).",
        metavar="ADDR",
    ),
    _f(
        "--logs-specs",
        "Refused: torch's LogsSpecs classes are not used.",
        refused="torchrun.logs_specs entry points are torch classes rallypoint does not load; set the log "
        "directory with --log-dir (agent.log_dir) and the console with --tee instead",
        metavar="NAME",
    ),
    _f(
        "--numa-binding",
        "Refused: no NUMA binding.",
        refused="rallypoint does not bind workers to NUMA nodes; start the workers under numactl "
        "(--no-python numactl --cpunodebind=N python train.py) or bind in the script (os.sched_setaffinity)",
        metavar="MODE",
    ),
    _f(
        "--signals-to-handle",
        "Signals the agent forwards to workers (agent.signals_to_handle, TORCHELASTIC_SIGNALS_TO_HANDLE); "
        "default SIGTERM,SIGINT,SIGHUP,SIGQUIT.",
        metavar="SIG,SIG",
    ),
    _f(
        "--shutdown-timeout",
        "Seconds workers get between SIGTERM and SIGKILL (agent.shutdown_timeout, or "
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT); default 30.",
        metavar="SECONDS",
    ),
    _f(
        "--virtual-local-rank",
        "Refused: LOCAL_RANK is the worker's real local rank.",
        is_flag=True,
        refused="LOCAL_RANK is always the worker's local rank here; pick the device in the script "
        "(torch.cuda.set_device(int(os.environ['LOCAL_RANK'])))",
    ),
)
BY_DEST: Mapping[str, TorchrunFlag] = {f.dest: f for f in TORCHRUN_FLAGS}
#: Flags whose option ``cli.run`` declares itself (they also serve rallypoint's own use).
_OWN = frozenset({"module", "local_addr"})


def torchrun_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add every torchrun flag (but ``-m`` and ``--local-addr``, declared by the command) to ``command``."""
    for flag in reversed(TORCHRUN_FLAGS):
        if flag.dest in _OWN:
            continue
        names = list(flag.names)
        kwargs: dict[str, Any] = {"help": flag.help, "hidden": flag.refused is not None and not flag.keep_default}
        if flag.is_flag:
            kwargs["is_flag"] = True
        else:
            kwargs["metavar"] = flag.metavar
        command = click.option(*names, flag.dest, **kwargs)(command)
        if flag.dest == "rdzv_id":  # rallypoint's own name for it, kept apart so errors name the one typed
            command = click.option("--run-id", "run_id", metavar="ID", help="Same as --rdzv-id.")(command)
    return command


def _src(flag: str) -> str:
    return f"{flag} {_FLAG}"


def _refuse(flag: TorchrunFlag, why: str | None = None) -> TorchrunRefused:
    return TorchrunRefused(f"{flag.name}: {why or flag.refused}")


def _nnodes(value: str) -> tuple[int, int]:
    from rallypoint.core.errors import ConfigError, ConfigIssue

    m = re.fullmatch(r"\s*([0-9]{1,9})\s*(?::\s*([0-9]{1,9})\s*)?", value)
    if not m:
        shown = repr(value) if len(value) <= 40 else repr(value[:37]) + "..."
        raise ConfigError([ConfigIssue(_src("--nnodes"), "nodes", f"expected N or MIN:MAX, got {shown}")])
    low = int(m.group(1))
    return low, int(m.group(2)) if m.group(2) else low


def _nproc(value: str, environ: Mapping[str, str]) -> Any:
    """``--nproc-per-node``: a number, ``auto``, or torchrun's ``gpu`` and ``cpu``, counted now."""
    from rallypoint.agent.plan import visible_gpus

    text = value.strip().lower()
    if text == "cpu":
        return os.cpu_count() or 1
    if text == "gpu":
        count = visible_gpus(environ)
        if not count:
            raise _refuse(BY_DEST["nproc_per_node"], "gpu: no GPU is visible on this node (CUDA_VISIBLE_DEVICES or "
                          "/dev/nvidia*); give a number, cpu or auto")  # fmt: skip
        return count
    if text == "xpu":
        raise _refuse(BY_DEST["nproc_per_node"], "xpu: rallypoint does not count XPUs; give the number of workers")
    return value


def _rdzv_conf(text: str, backend: str | None) -> list[Override]:
    """``--rdzv-conf K=V,...``: rendezvous timeouts, ``is_host``, and the backend's own options."""
    from rallypoint.core.config import parse_value
    from rallypoint.core.errors import ConfigError, ConfigIssue

    out: list[Override] = []
    for item in (p for p in text.split(",") if p.strip()):
        key, sep, value = item.partition("=")
        key = key.strip()
        source = _src(f"--rdzv-conf {key}")
        if not sep or not key:
            raise ConfigError([ConfigIssue(_src("--rdzv-conf"), "rendezvous", f"write K=V,K=V, got {item!r}")])
        parsed = parse_value(value.strip())
        if key in _RDZV_CONF_KEYS:
            out.append((_RDZV_CONF_KEYS[key], parsed, source))
        elif key == "is_host":
            serve = "auto" if str(parsed).lower() in ("true", "1", "yes") else "never"
            out.append(("rendezvous.options.serve", serve, source))
        elif key == "read_timeout" and backend == "grpc":
            out.append(("rendezvous.options.call_timeout", parsed, source))
        elif key in ("store_type", "use_libuv", "keep_alive_max_attempt", "read_timeout"):
            continue  # c10d store details: the grpc rendezvous has none of them (see the migration guide)
        else:
            out.append((f"rendezvous.options.{key}", parsed, source))
    return out


def _redirects(value: str, tee_given: bool) -> list[Override]:
    text = value.strip()
    if text == "0" or (text == "3" and tee_given):
        return []
    if text == "3":
        return [("agent.tee", "none", _src("--redirects"))]
    raise _refuse(
        BY_DEST["redirects"],
        f"{text!r}: rallypoint keeps stdout and stderr of every worker in its log file and shows them together; "
        "-r 3 (console shows nothing) and -r 0 are taken; select console ranks with --tee (e.g. --tee 0,1)",
    )


def _static(flags: Mapping[str, Any], run_id: tuple[str, str] | None) -> list[Override]:
    """Static rendezvous as the grpc backend at MASTER_ADDR:MASTER_PORT, group ranks from ``--node-rank``."""
    from rallypoint.core.errors import ConfigError, ConfigIssue

    if flags["nnodes"] is None:
        low = high = 1
    else:
        low, high = _nnodes(flags["nnodes"])
    if low != high:
        raise _refuse(BY_DEST["node_rank"], f"static rendezvous needs a fixed --nnodes, got {flags['nnodes']}; "
                      "for an elastic range use --rdzv-backend c10d --rdzv-endpoint HOST:PORT")  # fmt: skip
    node_rank = _int(flags["node_rank"] or "0", "--node-rank")
    if not 0 <= node_rank < low:
        raise ConfigError([ConfigIssue(_src("--node-rank"), "nodes", f"node rank {node_rank} is not below "
                                       f"--nnodes {low}")])  # fmt: skip
    port = _int(flags["master_port"] or str(MASTER_PORT), "--master-port")
    addr = (flags["master_addr"] or "127.0.0.1").strip("[]")
    endpoint = f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"
    which = "--master-addr" if flags["master_addr"] else "--node-rank"
    return [
        ("rendezvous.backend", "grpc", _src(which)),
        ("rendezvous.options.endpoint", endpoint, _src("--master-addr/--master-port")),
        ("rendezvous.run_id", run_id[0] if run_id else "none", _src(run_id[1] if run_id else "--node-rank")),
        ("ranks.strategy", "env", _src("--node-rank")),
        ("ranks.options", {"source": "torch", "level": "node"}, _src("--node-rank")),
    ]


def _int(text: str, flag: str) -> int:
    from rallypoint.core.errors import ConfigError, ConfigIssue

    if not text.strip().isdigit() or len(text.strip()) > 9:
        raise ConfigError([ConfigIssue(_src(flag), "", f"expected a non-negative number, got {text[:40]!r}")])
    return int(text)


def _run_id(flags: Mapping[str, Any]) -> tuple[str, str] | None:
    """The run id and the flag that gave it (``--run-id`` before ``--rdzv-id``), or ``None``."""
    for dest, flag in (("run_id", "--run-id"), ("rdzv_id", "--rdzv-id")):
        if flags.get(dest) is not None:
            return flags[dest], flag
    return None


def _number(text: str) -> Any:
    """An integer flag as a number where it reads as one (the job's bounds then apply), else as given."""
    stripped = text.strip()
    if len(stripped) <= 4000 and re.fullmatch(r"[+-]?[0-9]+", stripped):
        return int(stripped)
    return text


def _seconds(text: str | None) -> Any:
    """Torchrun's plain seconds (``0.5``) as a number; rallypoint's durations (``500ms``) as they are."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return text


def is_static(flags: Mapping[str, Any]) -> bool:
    """Whether the flags ask for torchrun's static rendezvous."""
    backend = flags.get("rdzv_backend")
    given = any(flags.get(k) is not None for k in ("node_rank", "master_addr", "master_port"))
    return backend == "static" or (backend is None and given and not flags.get("standalone"))


def static_node_env(flags: Mapping[str, Any]) -> dict[str, str]:
    """What this node publishes under static rendezvous: ``RANK`` (node rank), ``WORLD_SIZE`` (nodes)."""
    if not is_static(flags):
        return {}
    nodes = _nnodes(flags["nnodes"])[0] if flags["nnodes"] is not None else 1
    return {"RANK": str(_int(flags["node_rank"] or "0", "--node-rank")), "WORLD_SIZE": str(nodes)}


def _check_refused(flags: Mapping[str, Any]) -> None:
    for dest, value in flags.items():
        flag = BY_DEST.get(dest)
        if flag is None or flag.refused is None or value is None or value is False:
            continue
        if flag.keep_default is not None and str(value).strip() == flag.keep_default:
            continue
        raise _refuse(flag)
    method = flags.get("start_method")
    if method is not None and method not in ("spawn", "fork", "forkserver"):
        raise _refuse(BY_DEST["start_method"], f"{method!r} is not one of spawn, fork, forkserver")


def from_environment(flags: Mapping[str, Any], environ: Mapping[str, str]) -> tuple[dict[str, Any], set[str]]:
    """The ``PET_<DEST>`` variables torchrun reads, for the flags the command line does not give.

    As in torchrun, ``PET_NPROC_PER_NODE=4`` stands for ``--nproc-per-node 4`` and a flag
    without a value is on when its variable is a number other than 0 (``PET_STANDALONE=1``).
    Returns the flags and the ``dest`` of those taken from the environment.
    """
    out = dict(flags)
    used: set[str] = set()
    for flag in TORCHRUN_FLAGS:
        text = environ.get(f"PET_{flag.dest.upper()}")
        if text is None or out.get(flag.dest) not in (None, False):
            continue
        if flag.is_flag:
            if text.strip() not in ("", "0"):
                out[flag.dest] = True
                used.add(flag.dest)
        else:
            out[flag.dest] = text
            used.add(flag.dest)
    return out, used


def _relabel(overrides: list[Override], from_env: set[str]) -> list[Override]:
    """Sources of values whose flag came from a ``PET_*`` variable name that variable instead."""
    names = {BY_DEST[d].name: f"PET_{d.upper()}" for d in from_env}
    out = []
    for key, value, source in overrides:
        token = source.split(" ", 1)[0]
        parts = token.split("/")
        if parts and all(p in names for p in parts):
            source = source.replace(token, "/".join(names[p] for p in parts)).replace(_FLAG, "(environment)")
        out.append((key, value, source))
    return out


def torchrun_overrides(
    flags: Mapping[str, Any], environ: Mapping[str, str], from_env: set[str] | None = None
) -> list[Override]:
    """The job-key overrides the torchrun flags given on the command line stand for.

    Args:
        flags: the parsed flags by ``dest`` (``None`` or ``False`` when not given).
        environ: the agent's environment (``--nproc-per-node gpu`` counts its visible GPUs).
        from_env: the flags given by ``PET_*`` variables (see :func:`from_environment`): the
            values they set name the variable as their source.

    Raises:
        TorchrunRefused: a refused flag or value (exit code 2), with the reason and the alternative.
        ConfigError: a malformed value, naming the flag.
    """
    _check_refused(flags)
    out: list[Override] = []

    def add(key: str, value: Any, flag: str) -> None:
        if value is not None:
            out.append((key, value, _src(flag)))

    backend = flags.get("rdzv_backend")
    backend = _BACKEND_ALIASES.get(backend, backend) if backend else None
    if flags.get("standalone"):
        add("rendezvous.backend", "memory", "--standalone")
        add("nodes.min", 1, "--standalone")
        add("nodes.max", 1, "--standalone")
    elif is_static(flags):
        out += _static(flags, _run_id(flags))
    else:
        add("rendezvous.backend", backend, "--rdzv-backend")
    if flags.get("nproc_per_node") is not None:
        add("nodes.nproc_per_node", _nproc(flags["nproc_per_node"], environ), "--nproc-per-node")
    if flags.get("nnodes") is not None:
        low, high = _nnodes(flags["nnodes"])
        add("nodes.min", low, "--nnodes")
        add("nodes.max", high, "--nnodes")
    if not is_static(flags):
        given = _run_id(flags)
        if given is not None:
            add("rendezvous.run_id", *given)
    if flags.get("max_restarts") is not None:
        add("agent.max_restarts", _number(flags["max_restarts"]), "--max-restarts")
    add("agent.monitor_interval", _seconds(flags.get("monitor_interval")), "--monitor-interval")
    add("agent.log_dir", flags.get("log_dir"), "--log-dir")
    add("agent.tee", flags.get("tee"), "--tee")  # [agent] reads the text, torchrun's 0-3 included
    if flags.get("redirects") is not None:
        out += _redirects(flags["redirects"], flags.get("tee") is not None)
    if flags.get("rdzv_conf"):
        out += _rdzv_conf(flags["rdzv_conf"], backend)
    add("agent.role", flags.get("role"), "--role")
    add("agent.signals_to_handle", flags.get("signals_to_handle"), "--signals-to-handle")
    if flags.get("shutdown_timeout") is not None:
        add("agent.shutdown_timeout", _seconds(flags["shutdown_timeout"]), "--shutdown-timeout")
    elif environ.get(SHUTDOWN_ENV):  # torchrun reads it when the flag is not given
        out.append(("agent.shutdown_timeout", _seconds(environ[SHUTDOWN_ENV]), f"{SHUTDOWN_ENV} (environment)"))
    return _relabel(out, from_env) if from_env else out


def endpoint_value(flags: Mapping[str, Any], endpoint: str | None) -> str | None:
    """``--rdzv-endpoint`` as the backend wants it: c10d's ``HOST`` gets torchrun's port 29400."""
    if endpoint is None:
        return None
    backend = flags.get("rdzv_backend")
    if backend in ("c10d", "grpc") and not re.search(r":[0-9]+$", endpoint.strip()):
        return f"{endpoint.strip()}:{C10D_PORT}"
    return endpoint
