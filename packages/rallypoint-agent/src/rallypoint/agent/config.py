"""The agent's sections of the job file: ``[job]``, ``[nodes]``, ``[ranks]`` and ``[agent]``.

This package declares them (``rallypoint_config_sections``); core builds the job-file schema from
what the installed packages declare. ``ranks.strategy`` is a plain name here; core's resolution
looks it up among the rank strategies (:data:`~rallypoint.agent.records.RANK_STRATEGIES`) and
validates ``[ranks.options]`` with the selected strategy's ``options_model``.
"""

from __future__ import annotations

import ipaddress
import re
import string
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, model_validator
from pydantic_core import PydanticCustomError

from rallypoint.core.config import ConfigSection, Duration, PositiveDuration, Section, format_duration
from rallypoint.core.config.sections import cross_field_error
from rallypoint.rendezvous.config import RUN_ID_RULE, check_run_id

__all__ = [
    "AGENT_SECTIONS",
    "LOG_DIR_FIELDS",
    "MAX_NODES",
    "MAX_NODE_NAME_LENGTH",
    "MAX_POLL_SECONDS",
    "MAX_NPROC_PER_NODE",
    "MAX_RESTARTS",
    "AgentSection",
    "JobSection",
    "LaunchSection",
    "NodesSection",
    "NprocPerNode",
    "RanksSection",
    "Tee",
    "check_node_name",
]

#: The most nodes a job may name (``nodes.min``, ``nodes.max``, ``--nnodes``).
MAX_NODES = 65536
#: The most workers one node may run (``nodes.nproc_per_node``, ``--nproc-per-node``).
MAX_NPROC_PER_NODE = 1024
#: The largest restart budget (``agent.max_restarts``, ``--max-restarts``).
MAX_RESTARTS = 100_000
#: The longest ``agent.monitor_interval`` and ``agent.store_head_start``, in seconds: each is a wait
#: in the agent's loop, and a longer one leaves a finished or failed job unnoticed.
MAX_POLL_SECONDS = 60.0
#: The longest node id or host name (``--node-id``, ``--host-name``).
MAX_NODE_NAME_LENGTH = 128
_NODE_NAME = re.compile(r"[A-Za-z0-9._~:@+=,-]+")
#: The names ``agent.log_dir`` may use: ``{run_id}`` and ``{job}``.
LOG_DIR_FIELDS = ("run_id", "job")
_DIGITS = re.compile(r"\s*([0-9]+)\s*")
#: torchrun's ``--tee`` streams (0 none, 1 stdout, 2 stderr, 3 both); rallypoint shows both streams.
_TORCHRUN_TEE = {
    "0": "torchrun's --tee 0 (no stream) is ambiguous here: for rank 0 only write rank0 (or 0,), for no console "
    "output write none",
    "1": "torchrun's --tee 1 (stdout only) has no equivalent: rallypoint shows stdout and stderr together; "
    "write all, or 1, for rank 1 only",
    "2": "torchrun's --tee 2 (stderr only) has no equivalent: rallypoint shows stdout and stderr together; "
    "write all, or 2, for rank 2 only",
}


def _nproc(value: Any) -> int | str:
    if value == "auto":
        return "auto"
    shown = None
    if isinstance(value, str) and (digits := _DIGITS.fullmatch(value)):
        text = digits.group(1).lstrip("0") or "0"
        if len(text) > 18:  # the number as written, without turning thousands of digits into an int
            value, shown = MAX_NPROC_PER_NODE + 1, text if len(text) < 30 else f"a {len(text)}-digit number"
        else:
            value = int(text)
    if isinstance(value, int) and not isinstance(value, bool) and value > MAX_NPROC_PER_NODE:
        raise PydanticCustomError(
            "nproc_bound",
            "at most {bound} workers per node, got {value}",
            {"bound": MAX_NPROC_PER_NODE, "value": shown or _short(value)},
        )
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise PydanticCustomError(
        "nproc", 'expected a positive number of workers or "auto", got {value}', {"value": _short(value)}
    )


def _short(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 10**30:
        return f"a {len(str(value))}-digit number"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _tee_ranks(text: str) -> list[int] | None:
    """``"0,3"`` (or ``"3,"``) as a list of ranks; ``None`` when ``text`` is not such a list."""
    parts = [p.strip() for p in text.split(",")]
    if "," not in text or not all(p.isascii() and p.isdigit() for p in parts if p) or not any(parts):
        return None
    if any(not p for p in parts[:-1]):  # "0,,3": an empty entry before the last
        return None
    return [int(p) for p in parts if p]


def _tee(value: Any) -> str | list[int]:
    if value in ("all", "rank0", "none"):
        return str(value)
    if isinstance(value, str):
        text = value.strip()
        if text in _TORCHRUN_TEE:
            raise PydanticCustomError("tee_torchrun", _TORCHRUN_TEE[text])
        if text == "3":  # torchrun's "both streams": every rank's output, as rallypoint's all
            return "all"
        if ":" in text:
            raise PydanticCustomError(
                "tee_torchrun",
                "torchrun's per-local-rank form {value} has no equivalent: rallypoint shows stdout and stderr "
                "together; write all, none, rank0 or global ranks such as 0,3",
                {"value": _short(text)},
            )
        if text.isascii() and text.isdigit() and len(text) <= 9:
            return [int(text)]
        ranks = _tee_ranks(text)
        if ranks is not None:
            value = ranks
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        if any(v >= MAX_NODES * MAX_NPROC_PER_NODE for v in value):
            raise PydanticCustomError(
                "tee_bound",
                "ranks are below {bound}, got {value}",
                {"bound": MAX_NODES * MAX_NPROC_PER_NODE, "value": _short(value)},
            )
        return list(value)
    raise PydanticCustomError(
        "tee",
        'expected "all", "rank0", "none" or a list of ranks such as [0, 3] ("0,3" or "3," on the command line), '
        "got {value}",
        {"value": _short(value)},
    )


def _not_blank(value: str) -> str:
    if not value.strip():
        raise PydanticCustomError("blank", "is empty: give a script or module to run, or leave the key out")
    return value


def _no_nul(value: str) -> str:
    """Refuse NUL characters: no command line, environment or path can hold one."""
    if "\0" in value:
        raise PydanticCustomError("nul", "holds a NUL character (\\0): no command line, variable or path can hold one")
    return value


def _poll(seconds: float) -> float:
    if seconds > MAX_POLL_SECONDS:
        raise PydanticCustomError(
            "poll_bound",
            "at most {bound}, got {value}",
            {"bound": format_duration(MAX_POLL_SECONDS), "value": format_duration(seconds)},
        )
    return seconds


def _job_name(value: str) -> str:
    """A job name becomes part of the generated run id and of the log directory: the run id rules hold."""
    try:
        return check_run_id(value)
    except PydanticCustomError:
        raise PydanticCustomError(
            "job_name",
            "invalid job name {value}: it is part of the run id, and {rule}",
            {"value": _short(value), "rule": RUN_ID_RULE},
        ) from None


def check_node_name(value: str, what: str) -> str | None:
    """What is wrong with a node id or host name given on the command line, or ``None``.

    Both name the node in rendezvous keys (the default node id is ``<host>-<pid>``): 1 to
    :data:`MAX_NODE_NAME_LENGTH` ASCII letters, digits and ``. _ ~ : @ + = , -``, not ``.`` or ``..``.

    >>> check_node_name("gpu-3", "node id") is None, check_node_name("a b", "node id")[:26]
    (True, "invalid node id 'a b': a n")
    """
    if len(value) <= MAX_NODE_NAME_LENGTH and _NODE_NAME.fullmatch(value) and value not in (".", ".."):
        return None
    return (
        f"invalid {what} {_short(value)}: a node id or host name is 1 to {MAX_NODE_NAME_LENGTH} ASCII letters, "
        "digits and . _ ~ : @ + = , - (not '.' or '..')"
    )


_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"{_HOST_LABEL}(?:\.{_HOST_LABEL})*\.?")


def check_local_addr(value: str) -> str | None:
    """What is wrong with a ``--local-addr`` (an IP address or a host name), or ``None``.

    It becomes the node's address in the rendezvous and the workers' ``MASTER_ADDR``: other
    nodes connect to it.

    >>> check_local_addr("10.0.0.5") is None, check_local_addr("node3.cluster") is None
    (True, True)
    >>> check_local_addr("not an ip!")[:30]
    "invalid address 'not an ip!': "
    """
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        pass
    looks_numeric = value.replace(".", "").isdigit()  # 10.0.0.300: a mistyped IPv4 address, not a name
    if len(value) <= 253 and _HOST_NAME.fullmatch(value) and not looks_numeric:
        return None
    return (
        f"invalid address {_short(value)}: give this node's IP address or host name, the one the other nodes "
        "reach it at (e.g. 10.0.0.5 or node3.cluster; an IPv6 address without brackets)"
    )


def _env_name(value: str) -> str:
    _no_nul(value)
    if not value or "=" in value:
        raise PydanticCustomError(
            "env_name", "invalid variable name {name}: a name is not empty and has no '='", {"name": _short(value)}
        )
    return value


def _log_dir(value: str) -> str:
    """Check ``agent.log_dir`` is a path template using only ``{run_id}`` and ``{job}``."""
    _no_nul(value)
    try:
        parsed = list(string.Formatter().parse(value))
    except ValueError as exc:
        raise PydanticCustomError(
            "log_dir",
            "cannot read the template {value} ({error}); use {run_id} and {job}, and {{ }} for literal braces",
            {"value": _short(value), "error": str(exc)},
        ) from None
    for _text, name, spec, conversion in parsed:
        if name is None:
            continue
        if name not in LOG_DIR_FIELDS or spec or conversion:
            field = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise PydanticCustomError(
                "log_dir",
                "{field} is not a name the template knows: use {run_id} and {job} only (no format spec or "
                "conversion), and {{ }} for literal braces",
                {"field": _short(field)},
            )
    if not value.strip():
        raise PydanticCustomError("log_dir", "is empty; give a directory, e.g. runs/{run_id}")
    return value


def _signal_names(value: str) -> str:
    """``"SIGTERM,SIGUSR1"``: signal names this platform knows, normalised to upper case."""
    import signal

    names = [part.strip().upper() for part in value.split(",") if part.strip()]
    bad = [n for n in names if not n.startswith("SIG") or not isinstance(getattr(signal, n, None), signal.Signals)]
    if bad or not names or "SIGKILL" in names or "SIGSTOP" in names:
        raise PydanticCustomError(
            "signals",
            "expected signal names such as SIGTERM,SIGUSR1 (not SIGKILL or SIGSTOP), got {value}",
            {"value": _short(value)},
        )
    return ",".join(names)


#: Workers per node: a positive number up to :data:`MAX_NPROC_PER_NODE`, or ``"auto"`` (GPUs if any, else CPUs).
NprocPerNode = Annotated[int | str, BeforeValidator(_nproc)]
#: Which ranks reach the console: ``"all"``, ``"rank0"``, ``"none"`` or a list of ranks.
Tee = Annotated[str | list[int], BeforeValidator(_tee)]
_Text = Annotated[str, AfterValidator(_no_nul)]
#: The most bytes one argument (or variable) may hold on Linux, its NUL excluded (MAX_ARG_STRLEN).
MAX_ARG_BYTES = 32 * 4096 - 1


def _fits_exec(value: str) -> str:
    size = len(value.encode("utf-8", "surrogateescape"))
    if size > MAX_ARG_BYTES:
        raise PydanticCustomError(
            "arg_size",
            "holds {size} bytes; Linux passes at most 128 KiB in one argument or variable: write large data to a "
            "file and pass its path",
            {"size": size},
        )
    return value


_ExecText = Annotated[_Text, AfterValidator(_fits_exec)]
_Target = Annotated[str, AfterValidator(_no_nul), AfterValidator(_not_blank)]


_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _preload_list(value: Any) -> Any:
    """``agent.preload`` from a flag or variable is text: ``"torch,numpy"`` is two modules."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _line_prefix(value: str) -> str:
    from rallypoint.agent.line_prefix import check

    try:
        check(value)
    except ValueError as exc:
        raise PydanticCustomError("line_prefix", "{problem}", {"problem": str(exc)}) from None
    return value


def _module_name(value: str) -> str:
    if not _MODULE_NAME.fullmatch(value):
        raise PydanticCustomError(
            "module_name",
            "{value} is not a module name (dotted Python identifiers, e.g. torch)",
            {"value": _short(value)},
        )
    return value


class JobSection(Section):
    """``[job]``: what each worker runs."""

    name: Annotated[str, AfterValidator(_job_name)] | None = Field(
        default=None, description="Job name (run-id characters); defaults to the job file's stem."
    )
    entrypoint: _Target | None = Field(default=None, description="Script (or executable) each worker runs.")
    module: _Target | None = Field(default=None, description="Python module to run with -m, instead of entrypoint.")
    args: list[_ExecText] = Field(default_factory=list, description="Arguments passed to every worker.")
    env: dict[Annotated[str, AfterValidator(_env_name)], _ExecText] = Field(
        default_factory=dict, description="Extra environment for every worker."
    )

    @model_validator(mode="after")
    def _one_target(self) -> JobSection:
        if self.entrypoint and self.module:
            raise cross_field_error(
                "job_target",
                "set either entrypoint or module, not both (module runs as python -m)",
                ("module", "entrypoint"),
            )
        return self


class NodesSection(Section):
    """``[nodes]``: how many agents (nodes) and workers per node."""

    min: int = Field(default=1, ge=1, le=MAX_NODES, description="Fewest nodes the job runs with.")
    max: int | None = Field(default=None, ge=1, le=MAX_NODES, description="Most nodes; defaults to min (fixed size).")
    nproc_per_node: NprocPerNode = Field(default=1, description='Workers per node, or "auto".')

    @model_validator(mode="after")
    def _range(self) -> NodesSection:
        if self.max is not None and self.max < self.min:
            raise cross_field_error(
                "nodes_range", "max ({max}) is smaller than min ({min})", ("max", "min"), max=self.max, min=self.min
            )
        return self

    @property
    def max_nodes(self) -> int:
        """``max``, or ``min`` when no maximum is set."""
        return self.max if self.max is not None else self.min


class RanksSection(Section):
    """``[ranks]``: the rank-assignment strategy and its options."""

    strategy: str = "default"
    options: dict[str, Any] = Field(default_factory=dict)


class AgentSection(Section):
    """``[agent]``: restarts, monitoring, logs."""

    max_restarts: int = Field(
        default=3, ge=0, le=MAX_RESTARTS, description="Restarts for the whole job, not per agent."
    )
    monitor_interval: Annotated[PositiveDuration, AfterValidator(_poll)] = Field(
        default=0.1, description="How often workers and the rendezvous are checked."
    )
    exit_barrier_timeout: PositiveDuration = 300.0
    log_dir: Annotated[str, AfterValidator(_log_dir)] = Field(
        default="runs/{run_id}", description="Logs, error files and failure.json; {run_id} and {job} are filled in."
    )
    tee: Tee = "all"
    line_prefix: Annotated[str, AfterValidator(_line_prefix)] = Field(
        default="rallypoint",
        description='Prefix of worker lines on the console: "rallypoint" ([host:rank] ), "torchrun" '
        "([default0]:), or a template of {host}, {rank}, {local_rank}, {role}.",
    )
    store_head_start: Annotated[Duration, AfterValidator(_poll)] = Field(
        default=0.05,
        description="How long worker rank 0 (which serves the env:// store) starts before the others.",
    )
    preload: Annotated[list[Annotated[str, AfterValidator(_module_name)]], BeforeValidator(_preload_list)] = Field(
        default_factory=list,
        description='Modules a warm process imports once; workers are forked from it (e.g. ["torch"]).',
    )
    preload_keep: Duration = Field(
        default=0.0,
        ge=0,
        description="How long the warm process (preload) stays after the agent ends, for this user's next job "
        'on the node with the same modules and environment (e.g. "10m"); 0: it ends with the agent.',
    )
    shutdown_timeout: Duration = Field(
        default=30.0, description="How long stopped workers get between SIGTERM and SIGKILL (torchrun's default too)."
    )
    signals_to_handle: Annotated[str, AfterValidator(_signal_names)] = Field(
        default="SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        description="Signals the agent forwards to the workers before it stops (TORCHELASTIC_SIGNALS_TO_HANDLE).",
    )
    role: Annotated[str, AfterValidator(_job_name)] = Field(
        default="default", description="The workers' ROLE_NAME (torchrun's --role); every node of a job has the same."
    )

    @model_validator(mode="after")
    def _keep_needs_preload(self) -> AgentSection:
        if self.preload_keep > 0 and not self.preload:
            raise cross_field_error(
                "preload_keep",
                "preload_keep ({keep}) keeps the warm process of agent.preload, and preload names no module: "
                'list the modules to import once (e.g. preload = ["torch"]), or drop preload_keep',
                ("preload_keep", "preload"),
                keep=format_duration(self.preload_keep),
            )
        return self


#: The sections this package declares, in the order a job file shows them.
class LaunchSection(Section):
    """``[launch]``: the scheduler that started the agent (Slurm, Kubernetes), and what it fills in."""

    environment: str = Field(
        default="auto",
        description="Launch environment: auto (detected), slurm, kubernetes or none (nothing filled in).",
    )
    port: int = Field(default=29400, ge=1, le=65535, description="Port of the rendezvous endpoint it fills in.")
    options: dict[str, Any] = Field(default_factory=dict)


AGENT_SECTIONS: tuple[ConfigSection, ...] = (
    ConfigSection("job", JobSection, "what each worker runs"),
    ConfigSection("nodes", NodesSection, "how many nodes, and workers per node"),
    ConfigSection("ranks", RanksSection, "the rank-assignment strategy and its options"),
    ConfigSection("agent", AgentSection, "restarts, monitoring, logs"),
    ConfigSection(
        "launch",
        LaunchSection,
        "the scheduler that started the agent, and what it fills in",
        from_environment="rallypoint.agent.launch.apply:config_from_environment",
    ),
)
