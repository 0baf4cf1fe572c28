"""Generic, typed registries built from registration hooks.

A :class:`PluginKind` names one registration hook (``rallypoint_rendezvous_backends``) and how
users refer to what it registers (``"rendezvous backend"``). :meth:`Registry.collect` calls every
implementation of that hook, flattens the records, normalises names and aliases, and refuses
duplicates, naming both providing distributions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from rallypoint.core.errors import PluginConflictError, PluginError, PluginLoadError, UnknownPluginError
from rallypoint.core.records import BackendRecord, CliCommand, PluginRecord, load_object, normalize_name

if TYPE_CHECKING:
    from rallypoint.core.plugins import PluginInfo, RallypointPluginManager

__all__ = [
    "CLI_COMMANDS",
    "COLLECTIVE_BACKENDS",
    "KINDS",
    "RANK_STRATEGIES",
    "RENDEZVOUS_BACKENDS",
    "RPC_TRANSPORTS",
    "TIMER_BACKENDS",
    "Entry",
    "PluginKind",
    "Registry",
]

R = TypeVar("R", bound=PluginRecord)


@dataclass(frozen=True)
class PluginKind:
    """One kind of registrable thing.

    Attributes:
        hook: the registration hook's name, e.g. ``"rallypoint_rendezvous_backends"``.
        label: how messages call one of them, e.g. ``"rendezvous backend"``.
        distribution: the distribution that declares the hook specification; when it is not
            installed, nothing of this kind can be registered.
        record_type: the record class implementations must return (a base class that core knows).
        config_key: where the job file selects one, e.g. ``"rendezvous.backend"``.
        record_class: import path of the subsystem's own record class, e.g.
            ``"rallypoint.rendezvous.records:RendezvousBackendRecord"``; when set, records must be
            instances of it. It is imported only when the registry is collected, i.e. only when
            the subsystem that declares the hook is installed.
    """

    hook: str
    label: str
    distribution: str
    record_type: type[PluginRecord] = PluginRecord
    config_key: str | None = None
    record_class: str | None = None

    def expected_type(self) -> type[PluginRecord]:
        """The record class implementations of :attr:`hook` must return."""
        if self.record_class:
            try:
                cls = load_object(self.record_class)
            except PluginError:  # the declaring subsystem is not importable: check the base only
                return self.record_type
            if isinstance(cls, type) and issubclass(cls, self.record_type):
                return cls
        return self.record_type


RENDEZVOUS_BACKENDS = PluginKind(
    "rallypoint_rendezvous_backends",
    "rendezvous backend",
    "rallypoint-rendezvous",
    BackendRecord,
    config_key="rendezvous.backend",
    record_class="rallypoint.rendezvous.records:RendezvousBackendRecord",
)
RANK_STRATEGIES = PluginKind(
    "rallypoint_rank_strategies",
    "rank strategy",
    "rallypoint-agent",
    BackendRecord,
    config_key="ranks.strategy",
    record_class="rallypoint.agent.records:RankStrategyRecord",
)
COLLECTIVE_BACKENDS = PluginKind(
    "rallypoint_collective_backends",
    "collective backend",
    "rallypoint-collectives",
    BackendRecord,
    config_key="collectives.backend",
    record_class="rallypoint.collectives.records:CollectiveBackendRecord",
)
TIMER_BACKENDS = PluginKind(
    "rallypoint_timer_backends",
    "timer backend",
    "rallypoint-timer",
    BackendRecord,
    config_key="timer.watchdog",
    record_class="rallypoint.timer.records:TimerBackendRecord",
)
RPC_TRANSPORTS = PluginKind(
    "rallypoint_rpc_transports",
    "RPC transport",
    "rallypoint-rpc",
    BackendRecord,
    config_key="rpc.transport",
    record_class="rallypoint.rpc.records:RpcTransportRecord",
)
CLI_COMMANDS = PluginKind("rallypoint_cli_commands", "CLI command", "rallypoint-core", CliCommand)

#: Every registration kind, in the order ``rallypoint plugins list`` shows them.
KINDS: tuple[PluginKind, ...] = (
    RENDEZVOUS_BACKENDS,
    RANK_STRATEGIES,
    COLLECTIVE_BACKENDS,
    TIMER_BACKENDS,
    RPC_TRANSPORTS,
    CLI_COMMANDS,
)


@dataclass(frozen=True)
class Entry(Generic[R]):
    """A record and the plugin that registered it."""

    record: R
    provider: PluginInfo


class Registry(Generic[R]):
    """The records of one kind, by normalised name.

    Build one with :meth:`Registry.collect` (or ``pm.registry(kind)``, which caches it).
    """

    def __init__(
        self, kind: PluginKind, entries: list[Entry[R]], *, declared: bool = True, broken: tuple[str, ...] = ()
    ) -> None:
        self.kind = kind
        self.declared = declared
        self.broken = broken
        self._entries = entries
        self._by_name: dict[str, Entry[R]] = {}
        for entry in entries:
            for name in entry.record.names:
                if name in self._by_name:
                    first = self._by_name[name].provider.describe()
                    raise PluginConflictError(kind.label, name, first, entry.provider.describe())
                self._by_name[name] = entry

    @classmethod
    def collect(cls, pm: RallypointPluginManager, kind: PluginKind) -> Registry[R]:
        """Call every implementation of ``kind.hook`` and build the registry.

        A plugin whose hook raises, or returns something that is not a ``kind.expected_type()``, is
        reported as a load failure (a warning) and contributes nothing.

        Raises:
            PluginConflictError: two plugins registered the same name or alias.
        """
        broken = tuple(f.info.name for f in pm.load_failures)
        caller = getattr(pm.hook, kind.hook, None)
        if caller is None or not caller.has_spec():
            return cls(kind, [], declared=False, broken=broken)
        entries: list[Entry[R]] = []
        expected = kind.expected_type()
        # get_hookimpls() lists implementations in registration order (pluggy *calls* them in
        # reverse); keep that order so that "first" and "second" in conflicts mean what they say.
        for impl in caller.get_hookimpls():
            info = pm.info_for(impl.plugin)
            try:
                result = impl.function()
                records = list(result or ())
                for record in records:
                    if not isinstance(record, expected):
                        raise PluginError(f"{kind.hook} returned {record!r}; expected {expected.__name__} records")
            except Exception as exc:  # noqa: BLE001 - one broken plugin must not hide the others
                pm._fail(info, PluginLoadError(info.name, info.describe(), exc))
                continue
            entries.extend(Entry(record, info) for record in records)
        return cls(kind, entries, broken=tuple(f.info.name for f in pm.load_failures))

    def get(self, name: str, *, where: str | None = None) -> R:
        """The record registered as ``name`` (or one of its aliases).

        Args:
            name: the name as the user wrote it.
            where: where the name came from, quoted in the error, e.g.
                ``"rendezvous.backend in job.toml"``.

        Raises:
            UnknownPluginError: no such name; the message lists what is available and the closest match.
        """
        entry = self._by_name.get(normalize_name(name))
        if entry is None:
            raise UnknownPluginError(self.kind.label, name, self.names(), where=where, broken=self.broken)
        return entry.record

    def entry(self, name: str) -> Entry[R]:
        """The :class:`Entry` for ``name`` (record and provider)."""
        self.get(name)
        return self._by_name[normalize_name(name)]

    def names(self) -> list[str]:
        """Primary names of every record, sorted."""
        return sorted(normalize_name(e.record.name) for e in self._entries)

    def entries(self) -> list[Entry[R]]:
        """Every entry in registration order."""
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and normalize_name(name) in self._by_name

    def __iter__(self) -> Iterator[R]:
        return (e.record for e in self._entries)

    def __len__(self) -> int:
        return len(self._entries)
