"""Initialising torch's default process group: backend choice, options, adopting an existing one.

:func:`init` reads the worker environment (:mod:`rallypoint.collectives.env`), picks the backend
(:func:`~rallypoint.collectives.selection.select_backend`), validates ``[collectives.options]``
(``RALLYPOINT_COLLECTIVES_OPTIONS``) against the backend's ``options_model``, hands them to the
backend's factory, and creates the process group. Importing this module imports torch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as _dist
from torch.distributed import ProcessGroup

from rallypoint.collectives.broken import abort as abort_broken
from rallypoint.collectives.env import DEFAULT_BACKEND, DEFAULT_TIMEOUT, OPTIONS_ENV, WorkerEnv, parse_timeout
from rallypoint.collectives.records import BackendContext, CollectiveBackendRecord
from rallypoint.collectives.selection import backends_by_torch_name, select_backend
from rallypoint.collectives.state import GROUPS, PG_TIMEOUT_MARGIN, STATE, backend_records, use_backends
from rallypoint.core.errors import ConfigError, ConfigIssue

if TYPE_CHECKING:
    from pydantic import BaseModel

    from rallypoint.core.plugins import RallypointPluginManager

__all__ = ["CollectivesInfo", "backend_options", "destroy", "init", "is_initialized"]

log = logging.getLogger("rallypoint.collectives")


@dataclass(frozen=True)
class CollectivesInfo:
    """What :func:`init` set up.

    Attributes:
        backend: the rallypoint backend name (``"gloo"``, ``"nccl"``).
        torch_backend: the backend torch runs.
        device: ``"cpu"`` or ``"cuda"``: where tensors must live for this backend.
        reason: why this backend was chosen (also logged).
        rank: this worker's global rank.
        world_size: the number of workers.
        local_rank: this worker's rank on its node.
        timeout: the job-wide default timeout in seconds.
    """

    backend: str
    torch_backend: str
    device: str
    reason: str
    rank: int
    world_size: int
    local_rank: int
    timeout: float


def init(
    backend: str | None = None,
    *,
    timeout: float | str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    store: Any = None,
    environ: Mapping[str, str] | None = None,
    plugin_manager: RallypointPluginManager | None = None,
) -> CollectivesInfo:
    """Initialise torch's default process group from the worker environment.

    Reads what the agent (or torchrun, or anyone) sets: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR``, ``MASTER_PORT``, ``RALLYPOINT_COLLECTIVES_BACKEND`` (default ``auto``),
    ``RALLYPOINT_COLLECTIVES_TIMEOUT`` (seconds, default the backend's ``default_timeout`` or
    600) and ``RALLYPOINT_COLLECTIVES_OPTIONS`` (the ``[collectives.options]`` table as a JSON
    object, validated against the chosen backend's ``options_model`` and handed to its
    factory). Explicit arguments win over the environment.

    ``auto`` picks NCCL when CUDA and NCCL are usable, else Gloo, and logs which and why (logger
    ``rallypoint.collectives``, level INFO). A CUDA backend binds this worker to GPU
    ``LOCAL_RANK`` (modulo the visible devices). An existing default process group (a script
    called ``torch.distributed.init_process_group`` itself) is adopted as is.

    Args:
        backend: backend name or ``"auto"``.
        timeout: the job-wide default timeout (seconds or a duration such as ``"60s"``).
        rank: this worker's global rank (``RANK`` otherwise).
        world_size: the number of workers (``WORLD_SIZE`` otherwise).
        master_addr: host of the store (``MASTER_ADDR`` otherwise).
        master_port: port of the store (``MASTER_PORT`` otherwise).
        store: an existing ``torch.distributed.Store`` to rendezvous through instead.
        environ: where to read the variables (default :data:`os.environ`).
        plugin_manager: where backends are registered (default: a fresh one).

    Raises:
        BackendUnavailableError: the backend cannot run here (e.g. NCCL without CUDA), saying why.
        UnknownPluginError: no backend has that name.
        ConfigError: a variable is missing or malformed (options that do not fit the backend
            included), naming it.
    """
    env = WorkerEnv.from_environ(environ)
    if _dist.is_initialized():
        return _adopt(env, timeout, plugin_manager)
    if plugin_manager is None:
        from rallypoint.core.plugins import get_plugin_manager

        plugin_manager = get_plugin_manager()
    selection = select_backend(
        backend or env.backend or DEFAULT_BACKEND, plugin_manager=plugin_manager, where=_where(backend, env)
    )
    record = selection.record
    options = backend_options(record, env.options)  # before anything else: a typo fails fast
    seconds = _job_timeout(timeout, env, record)
    rank, world_size, local_rank = _ranks(rank, world_size, env)
    kwargs = _rendezvous_kwargs(env, store, master_addr, master_port)
    _create_default_group(record, options, rank, world_size, local_rank, seconds, kwargs)
    STATE.set(seconds)
    GROUPS.clear()
    use_backends(backends_by_torch_name(plugin_manager))
    message = "collectives: rank %d/%d uses %s (%s); default timeout %gs"
    log.info(message, rank, world_size, record.name, selection.reason, seconds)
    return CollectivesInfo(
        backend=record.name,
        torch_backend=record.torch_name,
        device=record.device,
        reason=selection.reason,
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        timeout=seconds,
    )


def backend_options(record: CollectiveBackendRecord, raw: Mapping[str, Any]) -> BaseModel | None:
    """Build ``record``'s options model from the ``[collectives.options]`` table ``raw``.

    Returns ``None`` for a backend without an ``options_model`` (which then takes no options).

    Raises:
        ConfigError: ``raw`` does not fit the model (or the backend takes no options); every
            issue names ``RALLYPOINT_COLLECTIVES_OPTIONS`` and the key.
    """
    where = f"{OPTIONS_ENV} (environment)"
    model = record.options_model
    if model is None:
        if raw:
            message = f"collective backend {record.name!r} takes no options; remove {', '.join(sorted(raw))}"
            raise ConfigError([ConfigIssue(where, "collectives.options", message)])
        return None
    from pydantic import ValidationError

    try:
        return model.model_validate(dict(raw))
    except ValidationError as exc:
        issues = [
            ConfigIssue(
                where,
                ".".join(["collectives.options", *(str(part) for part in error["loc"])]),
                f"{error['msg']} (options of collective backend {record.name!r})",
            )
            for error in exc.errors(include_url=False)
        ]
        raise ConfigError(issues) from None


def _ranks(rank: int | None, world_size: int | None, env: WorkerEnv) -> tuple[int, int, int]:
    """Global rank, world size and local rank: arguments first, then the environment."""
    rank = rank if rank is not None else env.rank
    world_size = world_size if world_size is not None else env.world_size
    local_rank = env.local_rank if env.local_rank is not None else (rank or 0)
    _require(rank, "RANK", "rank")
    _require(world_size, "WORLD_SIZE", "world_size")
    assert rank is not None
    assert world_size is not None
    return rank, world_size, local_rank


def _create_default_group(
    record: CollectiveBackendRecord,
    options: BaseModel | None,
    rank: int,
    world_size: int,
    local_rank: int,
    seconds: float,
    kwargs: dict[str, Any],
) -> None:
    """Bind the device, call the backend's factory and create torch's default process group."""
    device = _bind_device(record, local_rank)
    if device is not None:
        kwargs["device_id"] = device
    # A blocking backend's own timeout gets a margin so that the facade's (naming ranks) fires first.
    pg_timeout = seconds if record.stream_ordered else seconds + PG_TIMEOUT_MARGIN
    pg_options = _call_factory(record, BackendContext(options, rank, world_size, device, pg_timeout))
    if pg_options is not None:
        kwargs["pg_options"] = pg_options
    _dist.init_process_group(
        record.torch_name, rank=rank, world_size=world_size, timeout=timedelta(seconds=pg_timeout), **kwargs
    )


def _where(backend: str | None, env: WorkerEnv) -> str:
    if backend:
        return "backend argument of init()"
    if env.backend:
        return "RALLYPOINT_COLLECTIVES_BACKEND (environment)"
    return "collectives.backend default"


def _job_timeout(timeout: float | str | None, env: WorkerEnv, record: CollectiveBackendRecord) -> float:
    if timeout is not None:
        return parse_timeout(timeout, where="timeout argument of init()")
    if env.timeout is not None:
        return env.timeout
    return record.default_timeout or DEFAULT_TIMEOUT


def _rendezvous_kwargs(env: WorkerEnv, store: Any, master_addr: str | None, master_port: int | None) -> dict[str, Any]:
    """How torch finds the other ranks: a given store, ``tcp://`` from arguments, or ``env://``."""
    if store is not None:
        return {"store": store}
    if master_addr or master_port:
        addr = master_addr or env.master_addr
        port = master_port or env.master_port
        _require(addr, "MASTER_ADDR", "master_addr")
        _require(port, "MASTER_PORT", "master_port")
        return {"init_method": f"tcp://{addr}:{port}"}
    _require(env.master_addr, "MASTER_ADDR", "master_addr")
    _require(env.master_port, "MASTER_PORT", "master_port")
    return {"init_method": "env://"}


def _bind_device(record: CollectiveBackendRecord, local_rank: int) -> torch.device | None:
    """Bind a CUDA backend's worker to GPU ``local_rank`` (modulo the visible devices)."""
    if record.device != "cuda":
        return None
    index = local_rank % max(torch.cuda.device_count(), 1)
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _call_factory(record: CollectiveBackendRecord, context: BackendContext) -> Any:
    """The ``pg_options`` from the backend's factory (``None`` when it declares none)."""
    if not record.factory:
        return None
    factory = record.load()
    return factory(context)


def _require(value: object, variable: str, argument: str) -> None:
    if value is None:
        raise ConfigError(
            [
                ConfigIssue(
                    f"{variable} (environment)",
                    "",
                    f"is not set: run the worker under 'rallypoint run' (or torchrun), or pass {argument}= to init()",
                )
            ]
        )


def _adopt(
    env: WorkerEnv, timeout: float | str | None, plugin_manager: RallypointPluginManager | None
) -> CollectivesInfo:
    """Take over the default process group a script created itself (its options stay as they are)."""
    if timeout is not None:
        STATE.set(parse_timeout(timeout, where="timeout argument of init()"))
    elif env.timeout is not None:
        STATE.set(env.timeout)
    GROUPS.clear()
    if plugin_manager is not None:
        use_backends(backends_by_torch_name(plugin_manager))
    name = str(_dist.get_backend()).lower()
    reason = f"the default process group was already initialised with {name}"
    log.info("collectives: %s; adopting it", reason)
    return CollectivesInfo(
        backend=name,
        torch_backend=name,
        device="cuda" if any(r.device == "cuda" for r in backend_records(name)) else "cpu",
        reason=reason,
        rank=_dist.get_rank(),
        world_size=_dist.get_world_size(),
        local_rank=env.local_rank if env.local_rank is not None else _dist.get_rank(),
        timeout=STATE.default,
    )


def is_initialized() -> bool:
    """Whether torch's default process group exists."""
    return _dist.is_initialized()


def destroy(group: ProcessGroup | None = None) -> None:
    """Destroy ``group`` (default: every process group) and forget the facade's caches.

    A group on which a call timed out is aborted first and never waited for: this returns at once
    even though the timed-out call is still pending inside Gloo (see
    :mod:`rallypoint.collectives.broken`).
    """
    abort_broken(group)
    _dist.destroy_process_group(group)
    if group is None:
        GROUPS.clear()
    else:
        GROUPS.pop(group, None)
