"""The collective facade: torch.distributed in the seeds' vocabulary, with timeouts that name ranks.

Every function takes and returns plain torch tensors and process groups, with torch's argument
names and order; each one also accepts ``timeout=`` (seconds; ``None`` means the job default,
``[collectives] timeout``). Synchronous calls return the tensor(s) they filled (``recv`` returns
the sender's rank, as torch's does); ``async_op=True`` returns a :class:`Work` whose
``wait(timeout=None)`` applies the same timeout rules.

How a call is timed (see ``docs/collectives.md``):

* **Blocking backends (Gloo)**: the call is issued asynchronously and waited for with
  ``Work.wait(timeout)``, which is what torch's synchronous path does anyway minus the timeout.
  A call that outlasts a short probe (:data:`PROBE`) announces its arrival on the job's store
  (one key per rank and call); a call that outlasts its timeout reads those announcements and
  raises :class:`CollectiveTimeout` naming the ranks that never announced.
* **Stream-ordered backends (NCCL)**: without an explicit ``timeout=`` the call is exactly
  torch's (the CPU does not wait; torch's NCCL watchdog enforces the process group's timeout,
  which :func:`init` sets to the job default). With ``timeout=`` the CPU polls the work until it
  completes or the timeout passes, announcing and diagnosing the same way.

Importing this module imports torch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as _dist

from rallypoint.collectives.env import DEFAULT_BACKEND, DEFAULT_TIMEOUT, WorkerEnv, parse_timeout
from rallypoint.collectives.errors import CollectiveTimeout
from rallypoint.collectives.selection import select_backend

if TYPE_CHECKING:
    from rallypoint.core.plugins import RallypointPluginManager

__all__ = [
    "PROBE",
    "CollectivesInfo",
    "ProcessGroup",
    "ReduceOp",
    "Work",
    "all_gather",
    "all_reduce",
    "barrier",
    "broadcast",
    "default_timeout",
    "destroy",
    "gather",
    "get_rank",
    "get_world_size",
    "init",
    "irecv",
    "is_initialized",
    "isend",
    "new_group",
    "recv",
    "reduce",
    "scatter",
    "send",
]

log = logging.getLogger("rallypoint.collectives")

#: torch's reduction operations: ``SUM``, ``PRODUCT``, ``MAX``, ``MIN``, ``AVG`` (Gloo in torch
#: >= 2.13 and NCCL have it), ``BAND``, ``BOR``, ``BXOR``. The very same class as
#: ``torch.distributed.ReduceOp``, so either can be passed.
ReduceOp = _dist.ReduceOp
#: torch's process group type, as returned by :func:`new_group`.
ProcessGroup = _dist.ProcessGroup

#: Seconds a blocking call waits before it announces its arrival on the store (only calls that
#: take longer pay for it: one store write, and one delete when they complete).
PROBE = 0.2
#: Extra seconds a blocking backend's own process-group timeout gets over the job default, so
#: that the facade's timeout (which names the missing ranks) fires first.
PG_TIMEOUT_MARGIN = 10.0
_KEY_PREFIX = "rallypoint/collectives"
_SUM = _dist.ReduceOp.SUM


# ------------------------------------------------------------------------------------------------
# Process-wide state


class _State:
    """The job default timeout and the cached timedeltas of the fast path."""

    __slots__ = ("default", "default_td", "probe", "probe_td")

    def __init__(self, default: float) -> None:
        self.set(default)

    def set(self, default: float) -> None:
        self.default = default
        self.default_td = timedelta(seconds=default)
        self.probe = min(PROBE, default)
        self.probe_td = timedelta(seconds=self.probe)


def _env_default() -> float:
    timeout = WorkerEnv.from_environ().timeout
    return DEFAULT_TIMEOUT if timeout is None else timeout


_STATE = _State(_env_default())


def default_timeout() -> float:
    """The job-wide default timeout in seconds that calls without ``timeout=`` use."""
    return _STATE.default


class _GroupInfo:
    """What the facade caches per process group: its kind and a per-group call counter."""

    __slots__ = ("blocking", "group", "key", "seq")

    def __init__(self, group: ProcessGroup | None) -> None:
        self.group = group
        self.seq = 0
        try:
            backend = str(_dist.get_backend(group)).lower()
        except (RuntimeError, ValueError):  # not a member of ``group``: torch's calls are no-ops
            backend = "none"
        # NCCL-like backends order work on CUDA streams: the CPU does not wait for them.
        self.blocking = "nccl" not in backend
        self.key = group

    @property
    def pg(self) -> ProcessGroup:
        return self.group if self.group is not None else _dist.distributed_c10d._get_default_group()

    def name(self) -> str:
        if self.group is None or self.pg == _dist.distributed_c10d._get_default_group():
            return "WORLD"
        return f"group {_dist.distributed_c10d._get_process_group_name(self.pg)}"

    def ranks(self) -> list[int]:
        return list(_dist.get_process_group_ranks(self.pg))


_GROUPS: dict[ProcessGroup | None, _GroupInfo] = {}


def _info(group: ProcessGroup | None) -> _GroupInfo:
    info = _GROUPS.get(group)
    if info is None:
        info = _GROUPS[group] = _GroupInfo(group)
    return info


def _td(seconds: float) -> timedelta:
    return _STATE.default_td if seconds == _STATE.default else timedelta(seconds=seconds)


def _is_timeout(exc: BaseException) -> bool:
    return "timed out" in str(exc).lower()


# ------------------------------------------------------------------------------------------------
# Init


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
    ``MASTER_ADDR``, ``MASTER_PORT``, ``RALLYPOINT_COLLECTIVES_BACKEND`` (default ``auto``) and
    ``RALLYPOINT_COLLECTIVES_TIMEOUT`` (seconds, default the backend's ``default_timeout`` or
    600). Explicit arguments win over the environment.

    ``auto`` picks NCCL when CUDA and NCCL are usable, else Gloo, and logs which and why (logger
    ``rallypoint.collectives``, level INFO). A CUDA backend binds this worker to GPU
    ``LOCAL_RANK`` (modulo the visible devices).

    When torch's default process group already exists (a script called
    ``torch.distributed.init_process_group`` itself), it is adopted as is.

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
        ConfigError: a variable is missing or malformed, naming it.
    """
    env = WorkerEnv.from_environ(environ)
    if _dist.is_initialized():
        return _adopt(env, timeout)
    requested = backend or env.backend or DEFAULT_BACKEND
    where = "backend argument of init()" if backend else ("RALLYPOINT_COLLECTIVES_BACKEND (environment)")
    if not backend and not env.backend:
        where = "collectives.backend default"
    selection = select_backend(requested, plugin_manager=plugin_manager, where=where)
    record = selection.record
    if timeout is not None:
        seconds = parse_timeout(timeout, where="timeout argument of init()")
    elif env.timeout is not None:
        seconds = env.timeout
    else:
        seconds = record.default_timeout or DEFAULT_TIMEOUT
    rank = rank if rank is not None else env.rank
    world_size = world_size if world_size is not None else env.world_size
    local_rank = env.local_rank if env.local_rank is not None else (rank or 0)
    _require(rank, "RANK", "rank")
    _require(world_size, "WORLD_SIZE", "world_size")
    assert rank is not None
    assert world_size is not None

    kwargs: dict[str, Any] = {}
    if record.device == "cuda":
        index = local_rank % max(torch.cuda.device_count(), 1)
        torch.cuda.set_device(index)
        kwargs["device_id"] = torch.device("cuda", index)
        pg_timeout = seconds
    else:
        pg_timeout = seconds + PG_TIMEOUT_MARGIN
    if store is not None:
        kwargs["store"] = store
    else:
        addr = master_addr or env.master_addr
        port = master_port or env.master_port
        if master_addr or master_port:
            _require(addr, "MASTER_ADDR", "master_addr")
            _require(port, "MASTER_PORT", "master_port")
            kwargs["init_method"] = f"tcp://{addr}:{port}"
        else:
            _require(env.master_addr, "MASTER_ADDR", "master_addr")
            _require(env.master_port, "MASTER_PORT", "master_port")
            kwargs["init_method"] = "env://"
    _dist.init_process_group(
        record.torch_backend or record.name,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=pg_timeout),
        **kwargs,
    )
    _STATE.set(seconds)
    _GROUPS.clear()
    log.info(
        "collectives: rank %d/%d uses %s (%s); default timeout %gs",
        rank,
        world_size,
        record.name,
        selection.reason,
        seconds,
    )
    return CollectivesInfo(
        backend=record.name,
        torch_backend=record.torch_backend or record.name,
        device=record.device,
        reason=selection.reason,
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        timeout=seconds,
    )


def _require(value: object, variable: str, argument: str) -> None:
    if value is None:
        from rallypoint.core.errors import ConfigError, ConfigIssue

        raise ConfigError(
            [
                ConfigIssue(
                    f"{variable} (environment)",
                    "",
                    f"is not set: run the worker under 'rallypoint run' (or torchrun), or pass {argument}= to init()",
                )
            ]
        )


def _adopt(env: WorkerEnv, timeout: float | str | None) -> CollectivesInfo:
    if timeout is not None:
        _STATE.set(parse_timeout(timeout, where="timeout argument of init()"))
    elif env.timeout is not None:
        _STATE.set(env.timeout)
    _GROUPS.clear()
    name = str(_dist.get_backend()).lower()
    reason = f"the default process group was already initialised with {name}"
    log.info("collectives: %s; adopting it", reason)
    return CollectivesInfo(
        backend=name,
        torch_backend=name,
        device="cuda" if "nccl" in name else "cpu",
        reason=reason,
        rank=_dist.get_rank(),
        world_size=_dist.get_world_size(),
        local_rank=env.local_rank if env.local_rank is not None else _dist.get_rank(),
        timeout=_STATE.default,
    )


def is_initialized() -> bool:
    """Whether torch's default process group exists."""
    return _dist.is_initialized()


def destroy(group: ProcessGroup | None = None) -> None:
    """Destroy ``group`` (default: every process group) and forget the facade's caches."""
    _dist.destroy_process_group(group)
    if group is None:
        _GROUPS.clear()
    else:
        _GROUPS.pop(group, None)


def get_rank(group: ProcessGroup | None = None) -> int:
    """The rank of this worker in ``group`` (global rank by default), as torch's ``get_rank``."""
    return _dist.get_rank(group)


def get_world_size(group: ProcessGroup | None = None) -> int:
    """The number of ranks in ``group`` (the whole job by default)."""
    return _dist.get_world_size(group)


def new_group(
    ranks: Sequence[int] | None = None,
    timeout: float | None = None,
    backend: str | None = None,
    **kwargs: Any,
) -> ProcessGroup:
    """Create a sub-group, as torch's ``new_group`` (every rank must call it, members or not).

    Args:
        ranks: global ranks of the members (default: everyone).
        timeout: the group's own default in seconds; calls on it without ``timeout=`` still
            use the job default. ``None``: the job default.
        backend: torch backend name (default: the default group's).
        kwargs: passed on to ``torch.distributed.new_group``.
    """
    seconds = _STATE.default if timeout is None else timeout
    margin = PG_TIMEOUT_MARGIN if "nccl" not in str(backend or _dist.get_backend()).lower() else 0.0
    group: ProcessGroup = _dist.new_group(
        list(ranks) if ranks is not None else None,
        timeout=timedelta(seconds=seconds + margin),
        backend=backend,
        **kwargs,
    )
    return group


# ------------------------------------------------------------------------------------------------
# Waiting, announcing, diagnosing


class Work:
    """An asynchronous call in flight, as returned with ``async_op=True``, ``isend`` and ``irecv``.

    Wraps torch's ``Work``; :meth:`wait` applies the facade's timeout rules and raises
    :class:`CollectiveTimeout` instead of hanging.
    """

    __slots__ = ("_info", "_op", "_peer", "_result", "_seq", "_timeout", "work")

    def __init__(
        self,
        work: _dist.Work,
        op: str,
        info: _GroupInfo,
        seq: int,
        timeout: float | None,
        peer: int | None,
        result: Any = None,
    ) -> None:
        self.work = work
        self._op = op
        self._info = info
        self._seq = seq
        self._timeout = timeout
        self._peer = peer
        self._result = result

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the call completes (``True``), or raise :class:`CollectiveTimeout`.

        Args:
            timeout: seconds; default: the ``timeout=`` given to the call, else the job default.
        """
        _complete(self.work, self._op, self._info, self._seq, self._timeout if timeout is None else timeout, self._peer)
        return True

    def is_completed(self) -> bool:
        """Whether the call has completed (never blocks)."""
        return bool(self.work.is_completed())

    def result(self) -> Any:
        """What the synchronous call would have returned (the output tensor or tensors)."""
        return self._result

    def source_rank(self) -> int:
        """For an ``irecv`` from any source: the global rank of the sender (after :meth:`wait`)."""
        group_src = int(self.work._source_rank())
        return _dist.get_global_rank(self._info.pg, group_src) if self._info.group is not None else group_src

    def __repr__(self) -> str:
        return f"<rallypoint Work {self._op} completed={self.is_completed()}>"


def _complete(
    work: _dist.Work, op: str, info: _GroupInfo, seq: int, timeout: float | None, peer: int | None = None
) -> None:
    """Wait for ``work``: the fast path is one ``wait(probe)`` call on blocking backends."""
    if info.blocking:
        if peer is not None:  # point-to-point: the missing rank is the peer; one wait
            seconds = _STATE.default if timeout is None else timeout
            try:
                work.wait(_td(seconds))
            except RuntimeError as exc:
                if not _is_timeout(exc):
                    raise
                raise _p2p_timeout(op, info, peer, seconds) from exc
            return
        if timeout is None:
            try:
                work.wait(_STATE.probe_td)
                return
            except RuntimeError as exc:
                if not _is_timeout(exc):
                    raise
            _slow_wait(work, op, info, seq, _STATE.default, _STATE.probe)
            return
        probe = min(PROBE, timeout)
        try:
            work.wait(timedelta(seconds=probe))
            return
        except RuntimeError as exc:
            if not _is_timeout(exc):
                raise
        _slow_wait(work, op, info, seq, timeout, probe)
        return
    if timeout is None:  # stream-ordered backend, torch semantics
        work.wait()
        return
    _poll_wait(work, op, info, seq, timeout, peer)


def _finish(work: Any, op: str, info: _GroupInfo, timeout: float | None, async_op: bool, result: Any) -> Any:
    """Second half of every collective: count the call, then hand back a Work or complete it."""
    info.seq += 1
    if work is None:
        return result
    if async_op:
        return Work(work, op, info, info.seq, timeout, None, result)
    _complete(work, op, info, info.seq, timeout)
    return result


def _slow_wait(work: _dist.Work, op: str, info: _GroupInfo, seq: int, timeout: float, waited: float) -> None:
    key = _announce(info, seq, op)
    remaining = timeout - waited
    if remaining > 0:
        try:
            work.wait(timedelta(seconds=remaining))
        except RuntimeError as exc:
            if not _is_timeout(exc):
                raise
        else:
            _withdraw(key)
            return
    raise _diagnose(op, info, seq, timeout)


def _poll_wait(work: _dist.Work, op: str, info: _GroupInfo, seq: int, timeout: float, peer: int | None) -> None:
    start = time.monotonic()
    deadline = start + timeout
    key: str | None = None
    pause = 0.0001
    while not work.is_completed():
        now = time.monotonic()
        if key is None and peer is None and now - start >= min(PROBE, timeout):
            key = _announce(info, seq, op)
        if now >= deadline:
            if peer is not None:
                raise _p2p_timeout(op, info, peer, timeout)
            if key is None:
                _announce(info, seq, op)
            raise _diagnose(op, info, seq, timeout)
        time.sleep(pause)
        pause = min(pause * 2, 0.01)
    work.wait()
    if key is not None:
        _withdraw(key)


def _store() -> Any:
    return _dist.distributed_c10d._get_default_store()


def _key(info: _GroupInfo, seq: int, rank: int) -> str:
    name = _dist.distributed_c10d._get_process_group_name(info.pg)
    return f"{_KEY_PREFIX}/{name}/{seq}/{rank}"


def _announce(info: _GroupInfo, seq: int, op: str) -> str | None:
    """Tell the other ranks that this one reached call ``seq`` of the group (slow path only)."""
    try:
        key = _key(info, seq, _dist.get_rank())
        _store().set(key, op)
    except Exception as exc:  # noqa: BLE001 - the diagnosis degrades, the call goes on
        log.debug("collectives: could not announce arrival: %s", exc)
        return None
    return key


def _withdraw(key: str | None) -> None:
    if key is None:
        return
    try:
        _store().delete_key(key)
    except Exception as exc:  # noqa: BLE001 - a leftover key is harmless
        log.debug("collectives: could not delete %s: %s", key, exc)


def _grace() -> float:
    """How long to keep reading announcements after the timeout.

    A rank that arrived just before the deadline announces at most one probe later.
    """
    return min(PROBE, _STATE.probe) + 0.3


def _diagnose(op: str, info: _GroupInfo, seq: int, timeout: float) -> CollectiveTimeout:
    """Read the arrival announcements of call ``seq`` and name the ranks that never made one."""
    rank = _dist.get_rank()
    name = info.name()
    try:
        ranks = info.ranks()
    except Exception:  # noqa: BLE001 - should not happen; report what we can
        ranks = []
    try:
        store = _store()
        keys = {r: _key(info, seq, r) for r in ranks}
        seen: dict[int, str] = {}
        deadline = time.monotonic() + _grace()
        while True:
            for r, k in keys.items():
                if r not in seen and store.check([k]):
                    seen[r] = store.get(k).decode(errors="replace")
            if len(seen) == len(ranks) or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
    except Exception as exc:  # noqa: BLE001 - the store itself may be gone
        return CollectiveTimeout(
            op=op,
            group=name,
            group_ranks=ranks,
            missing=[],
            arrived=[rank],
            rank=rank,
            timeout=timeout,
            detail=f"the store could not be read to find them: {type(exc).__name__}: {exc}",
        )
    missing = [r for r in ranks if r not in seen]
    detail = f"call #{seq} on this group; arrival announced on the job's store by ranks {_fmt(sorted(seen))}"
    others = {r: o for r, o in seen.items() if o != op}
    if others:
        detail += "; ranks in a different call: " + ", ".join(f"{r} in {o}" for r, o in sorted(others.items()))
    if not missing:
        detail += "; every rank arrived, so the call itself is stuck (mismatched calls or a network problem)"
    return CollectiveTimeout(
        op=op,
        group=name,
        group_ranks=ranks,
        missing=missing,
        arrived=sorted(seen),
        rank=rank,
        timeout=timeout,
        detail=detail,
    )


def _p2p_timeout(op: str, info: _GroupInfo, peer: int, timeout: float) -> CollectiveTimeout:
    rank = _dist.get_rank()
    try:
        ranks = info.ranks()
        name = info.name()
    except Exception:  # noqa: BLE001 - report what we can
        ranks, name = [], "?"
    missing = list(ranks) if peer < 0 else [peer]
    missing = [r for r in missing if r != rank]
    what = "any sender" if peer < 0 else f"rank {peer}"
    return CollectiveTimeout(
        op=op,
        group=name,
        group_ranks=ranks,
        missing=missing,
        arrived=[rank],
        rank=rank,
        timeout=timeout,
        detail=f"point-to-point with {what}: the peer never posted the matching call",
    )


def _fmt(ranks: Sequence[int]) -> str:
    from rallypoint.collectives.errors import format_ranks

    return format_ranks(ranks)


# ------------------------------------------------------------------------------------------------
# Point to point


def send(
    tensor: torch.Tensor, dst: int, group: ProcessGroup | None = None, tag: int = 0, timeout: float | None = None
) -> None:
    """Send ``tensor`` to global rank ``dst`` and wait until it is sent (as torch's ``send``)."""
    info = _GROUPS.get(group) or _info(group)
    work = _dist.isend(tensor, dst, group, tag)
    if work is not None:
        _complete(work, "send", info, 0, timeout, dst)


def recv(
    tensor: torch.Tensor,
    src: int | None = None,
    group: ProcessGroup | None = None,
    tag: int = 0,
    timeout: float | None = None,
) -> int:
    """Receive into ``tensor`` from global rank ``src`` (any rank if ``None``); returns the sender."""
    info = _GROUPS.get(group) or _info(group)
    work = _dist.irecv(tensor, src, group, tag)
    if work is None:
        return -1
    _complete(work, "recv", info, 0, timeout, -1 if src is None else src)
    if src is not None:
        return src
    group_src = int(work._source_rank())
    return _dist.get_global_rank(info.pg, group_src) if group is not None else group_src


def isend(
    tensor: torch.Tensor, dst: int, group: ProcessGroup | None = None, tag: int = 0, timeout: float | None = None
) -> Work | None:
    """Start sending ``tensor`` to ``dst``; ``wait()`` on the result (``None`` off-group)."""
    info = _GROUPS.get(group) or _info(group)
    work = _dist.isend(tensor, dst, group, tag)
    return None if work is None else Work(work, "isend", info, 0, timeout, dst)


def irecv(
    tensor: torch.Tensor,
    src: int | None = None,
    group: ProcessGroup | None = None,
    tag: int = 0,
    timeout: float | None = None,
) -> Work | None:
    """Start receiving into ``tensor``; ``wait()`` on the result, then ``source_rank()``."""
    info = _GROUPS.get(group) or _info(group)
    work = _dist.irecv(tensor, src, group, tag)
    return None if work is None else Work(work, "irecv", info, 0, timeout, -1 if src is None else src, tensor)


# ------------------------------------------------------------------------------------------------
# Collectives. Each follows the same pattern: issue torch's call asynchronously, then either hand
# back a Work (async_op=True) or complete it (one wait on the fast path) and return the output.


def broadcast(
    tensor: torch.Tensor,
    src: int,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    timeout: float | None = None,
) -> Any:
    """Copy ``tensor`` from global rank ``src`` to every rank of the group; returns ``tensor``."""
    info = _GROUPS.get(group) or _info(group)
    if not info.blocking and timeout is None and not async_op:
        _dist.broadcast(tensor, src, group)
        return tensor
    return _finish(_dist.broadcast(tensor, src, group, True), "broadcast", info, timeout, async_op, tensor)


def all_reduce(
    tensor: torch.Tensor,
    op: Any = _SUM,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    timeout: float | None = None,
) -> Any:
    """Reduce ``tensor`` across the group in place with ``op``; every rank gets the result."""
    info = _GROUPS.get(group) or _info(group)
    if not info.blocking and timeout is None and not async_op:
        _dist.all_reduce(tensor, op, group)
        return tensor
    return _finish(_dist.all_reduce(tensor, op, group, True), "all_reduce", info, timeout, async_op, tensor)


def reduce(
    tensor: torch.Tensor,
    dst: int,
    op: Any = _SUM,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    timeout: float | None = None,
) -> Any:
    """Reduce ``tensor`` onto global rank ``dst`` with ``op``; returns ``tensor``.

    Only ``dst``'s tensor is guaranteed to hold the result; the others' content is unspecified
    (as in torch).
    """
    info = _GROUPS.get(group) or _info(group)
    if not info.blocking and timeout is None and not async_op:
        _dist.reduce(tensor, dst, op, group)
        return tensor
    return _finish(_dist.reduce(tensor, dst, op, group, True), "reduce", info, timeout, async_op, tensor)


def all_gather(
    tensor_list: list[torch.Tensor],
    tensor: torch.Tensor,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    timeout: float | None = None,
) -> Any:
    """Gather every rank's ``tensor`` into ``tensor_list`` on every rank; returns ``tensor_list``."""
    info = _GROUPS.get(group) or _info(group)
    if not info.blocking and timeout is None and not async_op:
        _dist.all_gather(tensor_list, tensor, group)
        return tensor_list
    return _finish(
        _dist.all_gather(tensor_list, tensor, group, True), "all_gather", info, timeout, async_op, tensor_list
    )


def gather(
    tensor: torch.Tensor,
    gather_list: list[torch.Tensor] | None = None,
    dst: int = 0,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    timeout: float | None = None,
) -> Any:
    """Gather every rank's ``tensor`` into ``gather_list`` on global rank ``dst``.

    Returns ``gather_list`` (``None`` on the other ranks, which pass none).
    """
    info = _GROUPS.get(group) or _info(group)
    if not info.blocking and timeout is None and not async_op:
        _dist.gather(tensor, gather_list, dst, group)
        return gather_list
    return _finish(_dist.gather(tensor, gather_list, dst, group, True), "gather", info, timeout, async_op, gather_list)


def scatter(
    tensor: torch.Tensor,
    scatter_list: list[torch.Tensor] | None = None,
    src: int = 0,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    timeout: float | None = None,
) -> Any:
    """Send ``scatter_list[i]`` from global rank ``src`` to the group's rank ``i``, into ``tensor``.

    Returns ``tensor``. Only ``src`` passes ``scatter_list``.
    """
    info = _GROUPS.get(group) or _info(group)
    if not info.blocking and timeout is None and not async_op:
        _dist.scatter(tensor, scatter_list, src, group)
        return tensor
    return _finish(_dist.scatter(tensor, scatter_list, src, group, True), "scatter", info, timeout, async_op, tensor)


def barrier(group: ProcessGroup | None = None, async_op: bool = False, timeout: float | None = None) -> Any:
    """Wait until every rank of the group reaches this call; ``None`` (or a :class:`Work`)."""
    info = _GROUPS.get(group) or _info(group)
    if not info.blocking and timeout is None and not async_op:
        _dist.barrier(group)
        return None
    return _finish(_dist.barrier(group, True), "barrier", info, timeout, async_op, None)
