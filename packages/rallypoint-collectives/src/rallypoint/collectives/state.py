"""What the facade remembers in a worker process.

The job's default timeout (with the ``timedelta`` objects the fast path reuses), what it knows
about each process group it has seen (stream-ordered or not, and a call counter), and the
registered collective backends by the name torch knows them by, which is how a group's kind is
found: from its backend record's ``stream_ordered`` field, never from its name.

Importing this module imports torch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from datetime import timedelta

import torch.distributed as _dist

from rallypoint.collectives.env import DEFAULT_TIMEOUT, TIMEOUT_ENV, parse_timeout
from rallypoint.collectives.records import CollectiveBackendRecord

__all__ = [
    "GROUPS",
    "PG_TIMEOUT_MARGIN",
    "PROBE",
    "STATE",
    "Defaults",
    "GroupInfo",
    "backend_records",
    "default_timeout",
    "group_info",
    "is_stream_ordered",
    "use_backends",
]

log = logging.getLogger("rallypoint.collectives")

#: Seconds a blocking call waits before it announces its arrival on the store (only calls that
#: take longer pay for it: one store write, and one delete when they complete).
PROBE = 0.2
#: Extra seconds a blocking backend's own process-group timeout gets over the job default, so
#: that the facade's timeout (which names the missing ranks) fires first.
PG_TIMEOUT_MARGIN = 10.0


class Defaults:
    """The job default timeout and the cached timedeltas of the fast path."""

    __slots__ = ("default", "default_td", "probe", "probe_td")

    def __init__(self, default: float) -> None:
        self.set(default)

    def set(self, default: float) -> None:
        """Make ``default`` seconds the job default (and its probe ``min(PROBE, default)``)."""
        self.default = default
        self.default_td = timedelta(seconds=default)
        self.probe = min(PROBE, default)
        self.probe_td = timedelta(seconds=self.probe)

    def td(self, seconds: float) -> timedelta:
        """``seconds`` as a timedelta (the cached one for the job default)."""
        return self.default_td if seconds == self.default else timedelta(seconds=seconds)


def _env_default() -> float:
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    return parse_timeout(raw, where=f"{TIMEOUT_ENV} (environment)") if raw else DEFAULT_TIMEOUT


#: The process-wide defaults; :func:`rallypoint.collectives.init` sets them.
STATE = Defaults(_env_default())


def default_timeout() -> float:
    """The job-wide default timeout in seconds that calls without ``timeout=`` use."""
    return STATE.default


# ------------------------------------------------------------------------------------------------
# Backend records by torch name

_BACKENDS: dict[str, CollectiveBackendRecord] | None = None


def use_backends(records: Mapping[str, CollectiveBackendRecord]) -> None:
    """Remember the registered backends, keyed by lower-case torch name (``init()`` does this)."""
    global _BACKENDS
    _BACKENDS = dict(records)


def _backends() -> dict[str, CollectiveBackendRecord]:
    """The registered backends; read from the plugins on first use when ``init()`` did not."""
    global _BACKENDS
    if _BACKENDS is None:
        from rallypoint.collectives.selection import backends_by_torch_name

        try:
            _BACKENDS = backends_by_torch_name()
        except Exception as exc:  # noqa: BLE001 - degrade to "blocking", which is always correct
            log.warning(
                "collectives: could not read the registered backends (%s: %s); every process group is "
                "timed as a blocking one. Run 'rallypoint plugins list' to see what fails to load",
                type(exc).__name__,
                exc,
            )
            _BACKENDS = {}
    return _BACKENDS


def backend_records(torch_backend: str) -> list[CollectiveBackendRecord]:
    """The records behind torch's name for a group's backend.

    torch names a group's backend ``"gloo"``, or ``"cpu:gloo,cuda:nccl"`` for a group with one
    backend per device; names no plugin registers are left out.
    """
    known = _backends()
    found = []
    for part in torch_backend.lower().split(","):
        record = known.get(part.rpartition(":")[2].strip())
        if record is not None:
            found.append(record)
    return found


def is_stream_ordered(torch_backend: str) -> bool:
    """Whether a group with this torch backend queues work on device streams (see the record)."""
    return any(record.stream_ordered for record in backend_records(torch_backend))


# ------------------------------------------------------------------------------------------------
# Process groups


class GroupInfo:
    """What the facade caches per process group: its kind and a per-group call counter.

    Attributes:
        group: the group (``None`` for the default group).
        stream_ordered: whether its backend's record says ``stream_ordered`` (see
            :class:`~rallypoint.collectives.records.CollectiveBackendRecord`).
        blocking: ``not stream_ordered``: the CPU waits for its calls, so the facade times
            them, issuing even synchronous calls asynchronously.
        seq: how many collectives this rank has issued on it; call *n* is the same call on every
            member, which is how arrivals are matched.
    """

    __slots__ = ("blocking", "group", "seq", "stream_ordered")

    def __init__(self, group: _dist.ProcessGroup | None) -> None:
        self.group = group
        self.seq = 0
        try:
            backend = str(_dist.get_backend(group))
        except (RuntimeError, ValueError):  # not a member of ``group``: torch's calls are no-ops
            backend = ""
        self.stream_ordered = is_stream_ordered(backend)
        self.blocking = not self.stream_ordered

    @property
    def pg(self) -> _dist.ProcessGroup:
        """The torch process group (the default group for ``None``)."""
        return self.group if self.group is not None else _dist.distributed_c10d._get_default_group()

    def name(self) -> str:
        """``"WORLD"`` or ``"group <torch name>"``, as errors write it."""
        if self.group is None or self.pg == _dist.distributed_c10d._get_default_group():
            return "WORLD"
        return f"group {_dist.distributed_c10d._get_process_group_name(self.pg)}"

    def ranks(self) -> list[int]:
        """The global ranks of the group's members."""
        return list(_dist.get_process_group_ranks(self.pg))


#: Every group the facade has seen, by group object (``None``: the default group).
GROUPS: dict[_dist.ProcessGroup | None, GroupInfo] = {}


def group_info(group: _dist.ProcessGroup | None) -> GroupInfo:
    """The cached :class:`GroupInfo` of ``group``, created on first use."""
    info = GROUPS.get(group)
    if info is None:
        info = GROUPS[group] = GroupInfo(group)
    return info
