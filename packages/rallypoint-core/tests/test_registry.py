"""Records and registries: names, aliases, typed records, lookups, errors users see."""

from __future__ import annotations

import acme_widgets
import click
import pytest

from rallypoint.core.builtin import CLI_COMMANDS
from rallypoint.core.errors import (
    MissingDependencyError,
    PluginConflictError,
    PluginError,
    UnknownPluginError,
    did_you_mean,
)
from rallypoint.core.plugins import PluginInfo, PluginLoadWarning, get_plugin_manager, hookimpl, hookspec
from rallypoint.core.records import BackendRecord, CliCommand, PluginRecord, Requirement, load_object, normalize_name
from rallypoint.core.registry import PluginKind, Registry, SpecialValue

HINT = "Install plugins with pip install rallypoint-<name>; see rallypoint plugins list"


class GizmoSpecs:
    @hookspec
    def rallypoint_gizmos(self):
        """Register gizmos."""


class GizmoSubsystem:
    @hookimpl
    def rallypoint_addhooks(self, pluginmanager):
        pluginmanager.add_hookspecs(GizmoSpecs)


GIZMOS = PluginKind(hook="rallypoint_gizmos", label="gizmo", record_class=BackendRecord, config_key="gizmos.kind")


class Gizmos:
    """A plugin returning fixed records from ``rallypoint_gizmos``."""

    def __init__(self, *records: object) -> None:
        self.records = records

    @hookimpl
    def rallypoint_gizmos(self):
        return list(self.records)


def gizmo_pm(**plugins: object):
    return get_plugin_manager(plugins={"gizmos": GizmoSubsystem(), **plugins}, autoload=False)


# ---------------------------------------------------------------------------------------------
# Names


@pytest.mark.parametrize(
    ("given", "normal"),
    [("acme", "acme"), (" My_Backend ", "my-backend"), ("ACME", "acme"), ("a-b_c", "a-b-c"), ("v3", "v3")],
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
    with pytest.raises(PluginError, match=r"invalid plugin name 'no way' in WidgetBackendRecord"):
        acme_widgets.WidgetBackendRecord(name="fine", aliases=("no way",))


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
    pm = gizmo_pm(maker=Gizmos(gear, BackendRecord(name="cog")))
    registry = pm.registry(GIZMOS)

    for spelling in ("big-gear", "Big_Gear", " BIG-GEAR ", "big_gear", "bg", "BG"):
        assert registry.get(spelling) is gear, spelling
        assert spelling in registry
    assert registry.names() == ["big-gear", "cog"]  # primary names only, sorted
    assert len(registry) == 2
    assert list(registry) == [gear, BackendRecord(name="cog")]
    assert registry.entry("bg").provider.name == "maker"
    assert 42 not in registry


def test_registry_of_a_declared_kind_returns_its_typed_records(acme_pm) -> None:
    registry = acme_pm.registry(acme_widgets.WIDGET_BACKENDS)

    record = registry.get("TKV")
    assert isinstance(record, acme_widgets.WidgetBackendRecord)
    assert record.name == "testkv"
    assert record.teeth == 12
    assert registry.get("testkv") is record
    assert registry.kind is acme_widgets.WIDGET_BACKENDS
    assert acme_pm.registry("rallypoint_widget_backends") is registry


def test_registry_is_cached_per_manager_and_rebuilt_after_a_registration() -> None:
    pm = gizmo_pm(maker=Gizmos(BackendRecord(name="cog")))
    first = pm.registry(GIZMOS)
    assert pm.registry(GIZMOS) is first

    pm.register_plugin(Gizmos(BackendRecord(name="sprocket")), PluginInfo("late", None, None))

    assert pm.registry(GIZMOS) is not first
    assert pm.registry(GIZMOS).names() == ["cog", "sprocket"]


def test_entries_keep_registration_order_and_provider() -> None:
    pm = gizmo_pm(
        first=Gizmos(BackendRecord(name="zeta")),
        second=Gizmos(BackendRecord(name="alpha"), BackendRecord(name="mid")),
    )

    entries = pm.registry(GIZMOS).entries()

    assert [(e.provider.name, e.record.name) for e in entries] == [
        ("first", "zeta"),
        ("second", "alpha"),
        ("second", "mid"),
    ]


def test_unknown_name_lists_what_is_available_suggests_and_hints() -> None:
    pm = gizmo_pm(maker=Gizmos(BackendRecord(name="sprocket"), BackendRecord(name="gear", aliases=("cog",))))

    with pytest.raises(UnknownPluginError) as info:
        pm.registry(GIZMOS).get("sprokket", where="gizmos.kind in job.toml")

    assert str(info.value) == (
        "unknown gizmo 'sprokket' (gizmos.kind in job.toml); available: gear, sprocket; "
        f"did you mean 'sprocket'? {HINT}"
    )
    assert info.value.suggestion == "sprocket"
    assert info.value.available == ["gear", "sprocket"]
    assert info.value.exit_code == 2


def test_unknown_name_without_a_close_match() -> None:
    pm = gizmo_pm(maker=Gizmos(BackendRecord(name="sprocket")))

    with pytest.raises(UnknownPluginError) as info:
        pm.registry(GIZMOS).entry("zzz")

    assert str(info.value) == f"unknown gizmo 'zzz'; available: sprocket. {HINT}"
    assert info.value.suggestion is None


def test_unknown_name_in_an_empty_registry() -> None:
    pm = gizmo_pm()

    with pytest.raises(UnknownPluginError) as info:
        pm.registry(GIZMOS).get("gear")

    assert str(info.value) == f"unknown gizmo 'gear'; available: none installed. {HINT}"


def test_kind_whose_hook_nobody_declares_is_an_empty_undeclared_registry() -> None:
    pm = get_plugin_manager(autoload=False)

    registry = pm.registry(GIZMOS)

    assert registry.declared is False
    assert len(registry) == 0
    with pytest.raises(UnknownPluginError, match="available: none installed"):
        registry.get("gear")


def test_registry_by_the_hook_name_of_a_kind_nobody_declares_is_an_error() -> None:
    pm = gizmo_pm()  # the hook has a specification, but no package declares the kind

    with pytest.raises(PluginError) as info:
        pm.registry("rallypoint_gizmos")

    assert str(info.value).startswith(
        "no installed package declares the plugin kind 'rallypoint_gizmos' (declared: rallypoint_cli_commands, "
    )
    assert str(info.value).endswith("; see rallypoint plugins list")


# ---------------------------------------------------------------------------------------------
# Plugin kinds


def test_kind_splits_its_config_key_and_knows_its_special_values() -> None:
    auto = SpecialValue("auto", "picked at run time", needs_plugin=True)
    kind = PluginKind(hook="rallypoint_gizmos", label="gizmo", record_class=BackendRecord,
                      config_key="gizmos.kind", special=(auto,), install_hint="pip install gizmos")  # fmt: skip

    assert (kind.section, kind.key) == ("gizmos", "kind")
    assert kind.special_value("auto") is auto
    assert kind.special_value("gear") is None
    cli = PluginKind(hook="rallypoint_cli_commands", label="CLI command", record_class=CliCommand)
    assert (cli.section, cli.key) == (None, None)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"hook": "gizmos"}, "hook 'gizmos' must be named rallypoint_<subsystem>_<things>"),
        ({"record_class": dict}, "record_class <class 'dict'> is not a PluginRecord subclass"),
        ({"config_key": "gizmos"}, "config_key 'gizmos' must be '<section>.<key>', e.g. 'widgets.backend'"),
        ({"config_key": "wid_gets.kind"}, "config_key 'wid_gets.kind' must be '<section>.<key>'"),
        (
            {"config_key": "gizmos.kind", "record_class": CliCommand},
            "a kind selected in the job file (config_key) needs BackendRecord records",
        ),
        ({"special": (SpecialValue("off", "disabled"),)}, "special values need a config_key"),
    ],
)
def test_invalid_kinds_are_refused(fields: dict[str, object], problem: str) -> None:
    given = {"hook": "rallypoint_gizmos", "label": "gizmo", "record_class": BackendRecord, **fields}

    with pytest.raises(PluginError) as info:
        PluginKind(**given)  # type: ignore[arg-type]

    assert str(info.value).startswith(f"invalid plugin kind 'gizmo': {problem}")


def test_declaring_a_kind_twice_is_a_load_failure_of_the_second() -> None:
    class Copycat:
        @hookimpl
        def rallypoint_plugin_kinds(self):
            same_key = PluginKind(
                hook="rallypoint_gizmos", label="gizmo", record_class=BackendRecord, config_key="gadgets.maker"
            )
            return [same_key]

    class Twice:
        @hookimpl
        def rallypoint_plugin_kinds(self):
            return [acme_widgets.WIDGET_BACKENDS]

    pm = get_plugin_manager(plugins={"copycat": Copycat(), "twice": Twice()}, autoload=False)

    with pytest.warns(PluginLoadWarning) as record:
        kinds = pm.kinds()

    assert [k.hook for k in kinds] == ["rallypoint_cli_commands", *(k.hook for k in acme_widgets.KINDS)]
    assert [str(w.message) for w in record] == [str(f.error) for f in pm.load_failures]
    copycat, twice = (str(f.error) for f in pm.load_failures)
    assert "config key 'gadgets.maker' is registered twice: by widgets (acme-widgets 1.0) and by copycat" in copycat
    assert (
        "plugin kind 'rallypoint_widget_backends' is registered twice: by widgets (acme-widgets 1.0) and by twice"
        in (twice)
    )


def test_kinds_hook_returning_something_else_is_a_load_failure() -> None:
    class Confused:
        @hookimpl
        def rallypoint_plugin_kinds(self):
            return ["rallypoint_widget_backends"]

    pm = get_plugin_manager(plugins={"confused": Confused()}, autoload=False)

    with pytest.warns(PluginLoadWarning, match="rallypoint_plugin_kinds returned 'rallypoint_widget_backends'; "
                      "expected PluginKind objects"):  # fmt: skip
        assert pm.kinds() == (CLI_COMMANDS, *acme_widgets.KINDS)


# ---------------------------------------------------------------------------------------------
# Conflicts


def test_two_plugins_registering_one_name_is_a_conflict_naming_both() -> None:
    pm = gizmo_pm(one=Gizmos(BackendRecord(name="gear")), two=Gizmos(BackendRecord(name="Gear")))

    with pytest.raises(PluginConflictError) as info:
        pm.registry(GIZMOS)

    assert str(info.value) == (
        "gizmo 'gear' is registered twice: by one and by two. "
        "Uninstall one of them, or disable one with RALLYPOINT_DISABLE_PLUGINS=<plugin>"
    )


def test_an_alias_clashing_with_another_plugins_name_is_a_conflict() -> None:
    pm = gizmo_pm(one=Gizmos(BackendRecord(name="gear")), two=Gizmos(BackendRecord(name="cog", aliases=("gear",))))

    with pytest.raises(PluginConflictError, match="gizmo 'gear' is registered twice: by one and by two"):
        pm.registry(GIZMOS)


# ---------------------------------------------------------------------------------------------
# Bad hook results are load failures, not crashes


def test_wrong_record_type_is_a_load_failure_warning() -> None:
    pm = gizmo_pm(bad=Gizmos("not a record"), good=Gizmos(BackendRecord(name="gear")))

    with pytest.warns(PluginLoadWarning) as record:
        registry = pm.registry(GIZMOS)

    assert registry.names() == ["gear"]
    [failure] = pm.load_failures
    assert failure.info.name == "bad"
    assert str(failure.error) == (
        "plugin 'bad' (bad) failed to load: PluginError: rallypoint_gizmos returned 'not a record'; "
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
        def rallypoint_widget_backends(self):
            # a gadget maker record returned from the widget backend hook
            return [acme_widgets.GadgetMakerRecord(name="mixed-up")]

        @hookimpl
        def rallypoint_gadget_makers(self):
            return [BackendRecord(name="untyped")]  # the base class, not a GadgetMakerRecord

    pm = get_plugin_manager(plugins={"confused": Confused()}, autoload=False)

    with pytest.warns(PluginLoadWarning, match="expected WidgetBackendRecord records"):
        widgets = pm.registry(acme_widgets.WIDGET_BACKENDS)
    with pytest.warns(PluginLoadWarning, match="expected GadgetMakerRecord records"):
        makers = pm.registry(acme_widgets.GADGET_MAKERS)

    assert "mixed-up" not in widgets
    assert "untyped" not in makers
    assert [f.info.name for f in pm.load_failures] == ["confused", "confused"]


def test_hook_that_raises_is_a_load_failure_and_others_still_register() -> None:
    class Exploding:
        @hookimpl
        def rallypoint_gizmos(self):
            raise RuntimeError("database unreachable")

    pm = gizmo_pm(boom=Exploding(), good=Gizmos(BackendRecord(name="gear")))

    with pytest.warns(PluginLoadWarning, match="plugin 'boom' .* RuntimeError: database unreachable"):
        registry = pm.registry(GIZMOS)

    assert registry.names() == ["gear"]
    assert registry.broken == ("boom",)


def test_hook_returning_none_registers_nothing() -> None:
    class Nothing:
        @hookimpl
        def rallypoint_gizmos(self):
            return None

    pm = gizmo_pm(nothing=Nothing())

    assert pm.registry(GIZMOS).names() == []
    assert pm.load_failures == []


# ---------------------------------------------------------------------------------------------
# Records: lazy loading, requirements, CLI commands


def test_load_object_imports_module_attributes() -> None:
    assert load_object("rallypoint.core.records:normalize_name") is normalize_name
    assert load_object("rallypoint.core.registry:Registry.get") is Registry.get


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
        record.check_requirements("widget backend")
    assert str(info.value) == (
        "widget backend 'needy' needs the Python module 'surely_not_installed_mod', which is not installed. "
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
    assert did_you_mean("acem", ["acme", "plain", "bent"]) == "acme"
    assert did_you_mean("zzz", ["acme", "plain", "bent"]) is None
    assert did_you_mean("x", []) is None


def test_plugin_record_is_the_common_base() -> None:
    for record_type in (BackendRecord, CliCommand, acme_widgets.WidgetBackendRecord, acme_widgets.WidgetPartRecord):
        assert issubclass(record_type, PluginRecord)
