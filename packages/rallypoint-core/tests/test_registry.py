"""Records and registries: names, aliases, typed records, lookups, errors users see."""

from __future__ import annotations

import click
import pytest

from rallypoint.collectives.records import CollectiveBackendRecord
from rallypoint.core.errors import (
    MissingDependencyError,
    PluginConflictError,
    PluginError,
    UnknownPluginError,
    did_you_mean,
)
from rallypoint.core.plugins import PluginInfo, PluginLoadWarning, get_plugin_manager, hookimpl, hookspec
from rallypoint.core.records import BackendRecord, CliCommand, PluginRecord, Requirement, load_object, normalize_name
from rallypoint.core.registry import KINDS, RANK_STRATEGIES, RENDEZVOUS_BACKENDS, PluginKind, Registry
from rallypoint.rendezvous.records import RendezvousBackendRecord

HINT = "Install plugins with pip install rallypoint-<name>; see rallypoint plugins list"


class WidgetSpecs:
    @hookspec
    def rallypoint_widgets(self):
        """Register widgets."""


class WidgetSubsystem:
    @hookimpl
    def rallypoint_addhooks(self, pluginmanager):
        pluginmanager.add_hookspecs(WidgetSpecs)


WIDGETS = PluginKind("rallypoint_widgets", "widget", "widget-dist", BackendRecord, config_key="widgets.kind")


class Widgets:
    """A plugin returning fixed records from ``rallypoint_widgets``."""

    def __init__(self, *records: object) -> None:
        self.records = records

    @hookimpl
    def rallypoint_widgets(self):
        return list(self.records)


def widget_pm(**plugins: object):
    return get_plugin_manager(plugins={"widgets": WidgetSubsystem(), **plugins}, autoload=False)


# ---------------------------------------------------------------------------------------------
# Names


@pytest.mark.parametrize(
    ("given", "normal"),
    [("etcd", "etcd"), (" My_Backend ", "my-backend"), ("ETCD", "etcd"), ("a-b_c", "a-b-c"), ("v3", "v3")],
)
def test_normalize_name(given: str, normal: str) -> None:
    assert normalize_name(given) == normal


@pytest.mark.parametrize("bad", ["", "has space", "dot.ted", "-leading", "_leading", "über", "a/b"])
def test_invalid_record_names_are_refused(bad: str) -> None:
    with pytest.raises(PluginError) as info:
        BackendRecord(name=bad)
    assert str(info.value) == (
        f"invalid plugin name {bad!r} in BackendRecord: use lower case letters, digits, '-' and '_', "
        "starting with a letter or digit"
    )


def test_invalid_alias_is_refused() -> None:
    with pytest.raises(PluginError, match=r"invalid plugin name 'no way' in RendezvousBackendRecord"):
        RendezvousBackendRecord(name="fine", aliases=("no way",))


def test_record_names_are_normalised_name_then_aliases() -> None:
    record = BackendRecord(name="Big_Gear", aliases=("BG", "large-gear"))

    assert record.names == ("big-gear", "bg", "large-gear")


def test_records_are_frozen() -> None:
    record = BackendRecord(name="gear")
    with pytest.raises(AttributeError):
        record.name = "other"  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# Lookups


def test_lookup_normalises_names_and_accepts_aliases() -> None:
    gear = BackendRecord(name="Big_Gear", aliases=("bg",), summary="a big gear")
    pm = widget_pm(maker=Widgets(gear, BackendRecord(name="cog")))
    registry = pm.registry(WIDGETS)

    for spelling in ("big-gear", "Big_Gear", " BIG-GEAR ", "big_gear", "bg", "BG"):
        assert registry.get(spelling) is gear, spelling
        assert spelling in registry
    assert registry.names() == ["big-gear", "cog"]  # primary names only, sorted
    assert len(registry) == 2
    assert list(registry) == [gear, BackendRecord(name="cog")]
    assert registry.entry("bg").provider.name == "maker"
    assert 42 not in registry


def test_registry_of_a_real_kind_returns_its_typed_records(acme_pm) -> None:
    registry = acme_pm.registry(RENDEZVOUS_BACKENDS)

    record = registry.get("TKV")
    assert isinstance(record, RendezvousBackendRecord)
    assert record.name == "testkv"
    assert record.multi_host is True
    assert registry.get("testkv") is record


def test_registry_is_cached_per_manager_and_rebuilt_after_a_registration() -> None:
    pm = widget_pm(maker=Widgets(BackendRecord(name="cog")))
    first = pm.registry(WIDGETS)
    assert pm.registry(WIDGETS) is first

    pm.register_plugin(Widgets(BackendRecord(name="sprocket")), PluginInfo("late", None, None))

    assert pm.registry(WIDGETS) is not first
    assert pm.registry(WIDGETS).names() == ["cog", "sprocket"]


def test_entries_keep_registration_order_and_provider() -> None:
    pm = widget_pm(
        first=Widgets(BackendRecord(name="zeta")),
        second=Widgets(BackendRecord(name="alpha"), BackendRecord(name="mid")),
    )

    entries = pm.registry(WIDGETS).entries()

    assert [(e.provider.name, e.record.name) for e in entries] == [
        ("first", "zeta"),
        ("second", "alpha"),
        ("second", "mid"),
    ]


def test_unknown_name_lists_what_is_available_suggests_and_hints() -> None:
    pm = widget_pm(maker=Widgets(BackendRecord(name="sprocket"), BackendRecord(name="gear", aliases=("cog",))))

    with pytest.raises(UnknownPluginError) as info:
        pm.registry(WIDGETS).get("sprokket", where="widgets.kind in job.toml")

    assert str(info.value) == (
        "unknown widget 'sprokket' (widgets.kind in job.toml); available: gear, sprocket; "
        f"did you mean 'sprocket'? {HINT}"
    )
    assert info.value.suggestion == "sprocket"
    assert info.value.available == ["gear", "sprocket"]
    assert info.value.exit_code == 2


def test_unknown_name_without_a_close_match() -> None:
    pm = widget_pm(maker=Widgets(BackendRecord(name="sprocket")))

    with pytest.raises(UnknownPluginError) as info:
        pm.registry(WIDGETS).entry("zzz")

    assert str(info.value) == f"unknown widget 'zzz'; available: sprocket. {HINT}"
    assert info.value.suggestion is None


def test_unknown_name_in_an_empty_registry() -> None:
    pm = widget_pm()

    with pytest.raises(UnknownPluginError) as info:
        pm.registry(WIDGETS).get("gear")

    assert str(info.value) == f"unknown widget 'gear'; available: none installed. {HINT}"


def test_kind_whose_hook_nobody_declares_is_an_empty_undeclared_registry() -> None:
    pm = get_plugin_manager(autoload=False)

    registry = pm.registry(WIDGETS)

    assert registry.declared is False
    assert len(registry) == 0
    with pytest.raises(UnknownPluginError, match="available: none installed"):
        registry.get("gear")


def test_registration_kinds_cover_every_subsystem() -> None:
    assert [k.label for k in KINDS] == [
        "rendezvous backend",
        "rank strategy",
        "collective backend",
        "timer backend",
        "RPC transport",
        "CLI command",
    ]
    assert [k.config_key for k in KINDS] == [
        "rendezvous.backend",
        "ranks.strategy",
        "collectives.backend",
        "timer.watchdog",
        "rpc.transport",
        None,
    ]


# ---------------------------------------------------------------------------------------------
# Conflicts


def test_two_plugins_registering_one_name_is_a_conflict_naming_both() -> None:
    pm = widget_pm(one=Widgets(BackendRecord(name="gear")), two=Widgets(BackendRecord(name="Gear")))

    with pytest.raises(PluginConflictError) as info:
        pm.registry(WIDGETS)

    assert str(info.value) == (
        "widget 'gear' is registered twice: by one and by two. "
        "Uninstall one of them, or disable one with RALLYPOINT_DISABLE_PLUGINS=<plugin>"
    )


def test_an_alias_clashing_with_another_plugins_name_is_a_conflict() -> None:
    pm = widget_pm(one=Widgets(BackendRecord(name="gear")), two=Widgets(BackendRecord(name="cog", aliases=("gear",))))

    with pytest.raises(PluginConflictError, match="widget 'gear' is registered twice: by one and by two"):
        pm.registry(WIDGETS)


# ---------------------------------------------------------------------------------------------
# Bad hook results are load failures, not crashes


def test_wrong_record_type_is_a_load_failure_warning() -> None:
    pm = widget_pm(bad=Widgets("not a record"), good=Widgets(BackendRecord(name="gear")))

    with pytest.warns(PluginLoadWarning) as record:
        registry = pm.registry(WIDGETS)

    assert registry.names() == ["gear"]
    [failure] = pm.load_failures
    assert failure.info.name == "bad"
    assert str(failure.error) == (
        "plugin 'bad' (bad) failed to load: PluginError: rallypoint_widgets returned 'not a record'; "
        "expected BackendRecord records. Reinstall it (pip install --force-reinstall bad), "
        "or disable it with RALLYPOINT_DISABLE_PLUGINS=bad"
    )
    assert [str(w.message) for w in record] == [str(failure.error)]
    with pytest.raises(UnknownPluginError) as info:
        registry.get("bolt")
    assert "plugins that failed to load: bad" in str(info.value)


def test_record_of_another_kind_is_refused(acme_pm) -> None:
    class Confused:
        @hookimpl
        def rallypoint_rendezvous_backends(self):
            # a collective backend record returned from the rendezvous hook
            return [CollectiveBackendRecord(name="mixed-up", torch_backend="gloo")]

        @hookimpl
        def rallypoint_rank_strategies(self):
            return [BackendRecord(name="untyped")]  # the base class, not a RankStrategyRecord

    pm = get_plugin_manager(plugins={"confused": Confused()}, autoload=False)

    with pytest.warns(PluginLoadWarning, match="expected RendezvousBackendRecord records"):
        rendezvous = pm.registry(RENDEZVOUS_BACKENDS)
    with pytest.warns(PluginLoadWarning, match="expected RankStrategyRecord records"):
        ranks = pm.registry(RANK_STRATEGIES)

    assert "mixed-up" not in rendezvous
    assert "untyped" not in ranks
    assert [f.info.name for f in pm.load_failures] == ["confused", "confused"]


def test_hook_that_raises_is_a_load_failure_and_others_still_register() -> None:
    class Exploding:
        @hookimpl
        def rallypoint_widgets(self):
            raise RuntimeError("database unreachable")

    pm = widget_pm(boom=Exploding(), good=Widgets(BackendRecord(name="gear")))

    with pytest.warns(PluginLoadWarning, match="plugin 'boom' .* RuntimeError: database unreachable"):
        registry = pm.registry(WIDGETS)

    assert registry.names() == ["gear"]
    assert registry.broken == ("boom",)


def test_hook_returning_none_registers_nothing() -> None:
    class Nothing:
        @hookimpl
        def rallypoint_widgets(self):
            return None

    pm = widget_pm(nothing=Nothing())

    assert pm.registry(WIDGETS).names() == []
    assert pm.load_failures == []


# ---------------------------------------------------------------------------------------------
# Records: lazy loading, requirements, CLI commands


def test_load_object_imports_module_attributes() -> None:
    assert load_object("rallypoint.core.records:normalize_name") is normalize_name
    assert load_object("rallypoint.core.registry:Registry.collect") == Registry.collect


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("no_colon_here", "invalid import path 'no_colon_here': write it as 'package.module:attribute'"),
        (":attr", "invalid import path ':attr': write it as 'package.module:attribute'"),
        ("surely_not_installed_mod:x", "cannot import 'surely_not_installed_mod' (for 'surely_not_installed_mod:x'): "),
        (
            "rallypoint.core.records:nope",
            "'rallypoint.core.records' has no attribute 'nope' (for 'rallypoint.core.records:nope')",
        ),
    ],
)
def test_load_object_errors(path: str, message: str) -> None:
    with pytest.raises(PluginError) as info:
        load_object(path)
    assert str(info.value).startswith(message)


def test_backend_record_load_and_missing_factory() -> None:
    assert BackendRecord(name="x", factory="rallypoint.core.records:Requirement").load() is Requirement
    with pytest.raises(PluginError, match="BackendRecord 'x' names no factory"):
        BackendRecord(name="x").load()


def test_requirements() -> None:
    assert Requirement(module="pydantic", install="pydantic").is_met()
    assert not Requirement(module="surely_not_installed_mod", install="x").is_met()
    assert not Requirement(module="surely_not_installed_mod.sub", install="x").is_met()

    record = BackendRecord(
        name="needy",
        requires=(
            Requirement(module="pluggy", install="pluggy"),
            Requirement(module="surely_not_installed_mod", install="x"),
        ),
    )
    with pytest.raises(MissingDependencyError) as info:
        record.check_requirements("rendezvous backend")
    assert str(info.value) == (
        "rendezvous backend 'needy' needs the Python module 'surely_not_installed_mod', which is not installed. "
        "Install it with: pip install x"
    )
    BackendRecord(name="ok", requires=(Requirement(module="pluggy", install="pluggy"),)).check_requirements("x")


def test_cli_command_records_load_click_commands() -> None:
    @click.command()
    def hello() -> None:
        """Say hello."""

    assert CliCommand(name="hello", command=lambda: hello).load() is hello
    assert CliCommand(name="config", command="rallypoint.core.commands:config").load().name == "config"
    with pytest.raises(
        PluginError, match=r"CLI command 'bad' \('rallypoint.core.plugins:PROJECT_NAME'\) is not a click"
    ):
        CliCommand(name="bad", command="rallypoint.core.plugins:PROJECT_NAME").load()
    with pytest.raises(PluginError, match=r"CLI command 'worse' .* is not a click command"):
        CliCommand(name="worse", command=lambda: 42).load()


def test_did_you_mean() -> None:
    assert did_you_mean("etdc", ["etcd", "file", "grpc"]) == "etcd"
    assert did_you_mean("zzz", ["etcd", "file", "grpc"]) is None
    assert did_you_mean("x", []) is None


def test_plugin_record_is_the_common_base() -> None:
    for record_type in (BackendRecord, CliCommand, RendezvousBackendRecord, CollectiveBackendRecord):
        assert issubclass(record_type, PluginRecord)
