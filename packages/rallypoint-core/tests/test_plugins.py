"""The plugin manager: essential packages, entry points, historic hook specs, validation, env controls."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import acme_widgets
import pluggy
import pytest

from rallypoint.core import builtin
from rallypoint.core.builtin import CLI_COMMANDS
from rallypoint.core.errors import PluginConflictError
from rallypoint.core.plugins import (
    ESSENTIAL_GROUP,
    PluginLoadWarning,
    essential_distributions,
    get_plugin_manager,
    hookimpl,
    hookspec,
)
from rallypoint.core.records import BackendRecord
from rallypoint.core.registry import PluginKind

WIDGET_BACKENDS = acme_widgets.WIDGET_BACKENDS
ESSENTIAL_NAMES = ["core", "widgets"]


def test_core_and_essential_packages_are_registered_without_autoload() -> None:
    pm = get_plugin_manager(autoload=False)

    assert list(pm.infos) == ESSENTIAL_NAMES
    assert pm.get_plugin("core") is builtin
    assert pm.get_plugin("widgets") is acme_widgets
    core, widgets = pm.infos["core"], pm.infos["widgets"]
    assert (core.distribution, core.essential) == ("rallypoint-core", True)
    assert (widgets.distribution, widgets.version, widgets.essential) == ("acme-widgets", "1.0", True)
    assert pm.essential_names == ESSENTIAL_NAMES
    assert pm.load_failures == []


def test_core_alone_registers_only_itself_and_declares_only_cli_commands(core_alone) -> None:
    pm = get_plugin_manager(environ={})

    assert list(pm.infos) == ["core"]
    assert pm.kinds() == (CLI_COMMANDS,)
    assert pm.sections() == ()
    assert pm.job_schema().names == ()
    assert pm.registry(CLI_COMMANDS).names() == ["config", "plugin", "plugins"]
    assert essential_distributions()[0][0] == "rallypoint-core"


def test_essential_package_declares_its_hooks_kinds_and_sections() -> None:
    pm = get_plugin_manager(autoload=False)

    core_hooks = ("rallypoint_addhooks", "rallypoint_plugin_kinds", "rallypoint_config_sections")
    for hook in (*core_hooks, *(k.hook for k in acme_widgets.KINDS)):
        assert getattr(pm.hook, hook).has_spec(), hook
    assert pm.kinds() == (CLI_COMMANDS, *acme_widgets.KINDS)
    assert pm.kind("rallypoint_gadget_makers") is acme_widgets.GADGET_MAKERS
    assert pm.sections() == acme_widgets.SECTIONS
    assert pm.declared_by["plugin kind rallypoint_widget_backends"] == "widgets"
    assert pm.declared_by["plugin kind rallypoint_cli_commands"] == "core"
    assert pm.declared_by["config key gadgets.maker"] == "widgets"
    assert pm.declared_by["config section delivery"] == "widgets"


def test_core_registers_the_plugins_and_config_commands() -> None:
    pm = get_plugin_manager(autoload=False)

    registry = pm.registry(CLI_COMMANDS)
    assert [(e.record.name, e.provider.name) for e in registry.entries()] == [
        ("plugins", "core"),
        ("config", "core"),
        ("plugin", "core"),
    ]
    assert pm.registry("rallypoint_cli_commands") is registry  # by hook name, same cached registry


def test_entry_point_plugins_are_loaded_after_the_essential_ones() -> None:
    pm = get_plugin_manager(environ={})

    assert list(pm.infos) == [*ESSENTIAL_NAMES, "cogs"]
    cogs = pm.infos["cogs"]
    assert (cogs.distribution, cogs.version, cogs.essential) == ("acme-cogs", "2.0", False)
    entry = pm.registry(WIDGET_BACKENDS).entry("cog")
    assert entry.provider.describe() == "cogs (acme-cogs 2.0)"
    assert pm.registry(WIDGET_BACKENDS).names() == ["cog", "plain"]


def test_essential_distributions_are_listed_without_importing_them(make_distribution, tmp_path, monkeypatch) -> None:
    module = make_distribution(
        tmp_path, dist="acme-extra", version="0.9", entry_point="extra", source="raise ImportError('never')\n",
        group=ESSENTIAL_GROUP,
    )  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))

    found = essential_distributions()

    assert found[0][0] == "rallypoint-core"
    assert found[1:] == [("acme-extra", "0.9"), ("acme-widgets", "1.0")]
    assert module not in sys.modules


def test_third_party_entry_point_is_registered_with_its_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_distribution
) -> None:
    make_distribution(
        tmp_path,
        dist="acme-widget-kv",
        version="2.3.1",
        entry_point="acme",
        source="""
            from acme_widgets import WidgetBackendRecord
            from rallypoint.core.plugins import hookimpl

            @hookimpl
            def rallypoint_widget_backends():
                return [WidgetBackendRecord(name="acme-kv", factory="acme:Backend")]
        """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    pm = get_plugin_manager(environ={})

    assert pm.infos["acme"].distribution == "acme-widget-kv"
    assert pm.infos["acme"].version == "2.3.1"
    entry = pm.registry(WIDGET_BACKENDS).entry("acme-kv")
    assert entry.provider.describe() == "acme (acme-widget-kv 2.3.1)"


def test_plugins_argument_registers_objects_by_name(acme_pm) -> None:
    assert "acme" in acme_pm.infos
    assert acme_pm.infos["acme"].distribution is None
    assert acme_pm.registry(WIDGET_BACKENDS).entry("testkv").provider.name == "acme"


def test_each_call_builds_a_fresh_manager() -> None:
    class Extra:
        @hookimpl
        def rallypoint_widget_backends(self):
            return [acme_widgets.WidgetBackendRecord(name="only-here", factory="x:y")]

    with_extra = get_plugin_manager(plugins={"extra": Extra()}, autoload=False)
    without = get_plugin_manager(autoload=False)

    assert with_extra is not without
    assert "only-here" in with_extra.registry(WIDGET_BACKENDS)
    assert "only-here" not in without.registry(WIDGET_BACKENDS)


# ---------------------------------------------------------------------------------------------
# Historic rallypoint_addhooks; kinds and sections collected once every plugin is registered


class SprocketSpecs:
    @hookspec
    def rallypoint_sprockets(self):
        """Register sprockets (a hook of another made-up subsystem)."""


SPROCKETS = PluginKind(hook="rallypoint_sprockets", label="sprocket", record_class=BackendRecord)


class SprocketSubsystem:
    """Adds the sprocket hook specification through the historic bootstrap hook, and declares its kind."""

    def __init__(self) -> None:
        self.called_with: list[object] = []

    @hookimpl
    def rallypoint_addhooks(self, pluginmanager):
        self.called_with.append(pluginmanager)
        pluginmanager.add_hookspecs(SprocketSpecs)

    @hookimpl
    def rallypoint_plugin_kinds(self):
        return [SPROCKETS]


class SprocketMaker:
    @hookimpl
    def rallypoint_sprockets(self):
        return [BackendRecord(name="gear")]


def test_addhooks_is_historic_and_lets_a_plugin_add_hook_specs() -> None:
    subsystem = SprocketSubsystem()
    # The implementation is registered before the plugin that declares its specification.
    pm = get_plugin_manager(plugins={"maker": SprocketMaker(), "sprockets": subsystem}, autoload=False)

    assert subsystem.called_with == [pm]  # called although registered after the historic call
    assert pm.hook.rallypoint_sprockets.has_spec()
    assert pm.hook.rallypoint_sprockets() == [[BackendRecord(name="gear")]]
    assert pm.registry(SPROCKETS).names() == ["gear"]
    assert pm.registry("rallypoint_sprockets").names() == ["gear"]


def test_addhooks_reaches_plugins_registered_after_the_manager_was_built() -> None:
    pm = get_plugin_manager(autoload=False)
    subsystem = SprocketSubsystem()

    pm.register(subsystem, name="late")

    assert subsystem.called_with == [pm]
    assert pm.hook.rallypoint_sprockets.has_spec()


def test_kinds_are_collected_again_after_a_late_registration() -> None:
    pm = get_plugin_manager(autoload=False)
    before = pm.kinds()
    assert SPROCKETS not in before
    assert pm.kinds() is before  # cached

    pm.register(SprocketSubsystem(), name="late")

    assert pm.kinds() == (*before, SPROCKETS)
    pm.unregister(name="late")
    assert pm.kinds() == before


# ---------------------------------------------------------------------------------------------
# check_pending


class Misspelled:
    @hookimpl
    def rallypoint_widget_backend(self):  # missing the final "s"
        return []


def test_misspelled_hookimpl_is_an_error() -> None:
    with pytest.raises(
        pluggy.PluginValidationError,
        match=r"implements 'rallypoint_widget_backend', .* did you mean 'rallypoint_widget_backends'\?",
    ):
        get_plugin_manager(plugins={"typo": Misspelled()}, autoload=False)


def test_hook_of_a_package_that_is_not_installed_is_an_error(core_alone) -> None:
    class NeedsWidgets:
        @hookimpl
        def rallypoint_widget_backends(self):
            return []

    with pytest.raises(pluggy.PluginValidationError) as info:
        get_plugin_manager(plugins={"orphan": NeedsWidgets()}, autoload=False)

    assert str(info.value) == (
        "plugin orphan implements 'rallypoint_widget_backends', a hook that no installed package declares. "
        "Fix the hook name in the plugin, install the package that declares it, or disable the plugin with "
        "RALLYPOINT_DISABLE_PLUGINS=orphan"
    )


def test_hookimpl_with_an_argument_the_spec_lacks_is_an_error() -> None:
    class BadSignature:
        @hookimpl
        def rallypoint_widget_backends(self, config):
            return []

    with pytest.raises(pluggy.PluginValidationError, match="config"):
        get_plugin_manager(plugins={"bad": BadSignature()}, autoload=False)


def test_misspelled_hook_in_an_entry_point_plugin_is_a_load_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_distribution
) -> None:
    make_distribution(
        tmp_path,
        dist="typo-plugin",
        entry_point="typo",
        source="""
            from rallypoint.core.plugins import hookimpl

            @hookimpl
            def rallypoint_gadget_maker():
                return []
        """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    with pytest.warns(PluginLoadWarning, match="rallypoint_gadget_maker"):
        pm = get_plugin_manager(environ={})

    assert not pm.has_plugin("typo")
    assert "cogs" in pm.infos  # the others load
    (failure,) = pm.load_failures
    assert failure.info.distribution == "typo-plugin"
    assert re.search(
        r"implements 'rallypoint_gadget_maker', a hook that no .* did you mean 'rallypoint_gadget_makers'\?",
        str(failure.error),
    )


# ---------------------------------------------------------------------------------------------
# Conflicts


def _kv_plugin(name: str) -> str:
    return f"""
        from acme_widgets import WidgetBackendRecord
        from rallypoint.core.plugins import hookimpl

        @hookimpl
        def rallypoint_widget_backends():
            return [WidgetBackendRecord(name="{name}", factory="x:y")]
    """


def test_two_distributions_registering_one_name_conflict_naming_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_distribution
) -> None:
    make_distribution(tmp_path, dist="alpha-kv", version="1.0", entry_point="alpha", source=_kv_plugin("shared"))
    make_distribution(tmp_path, dist="beta-kv", version="2.5", entry_point="beta", source=_kv_plugin("Shared"))
    monkeypatch.syspath_prepend(str(tmp_path))
    pm = get_plugin_manager(environ={})

    with pytest.raises(PluginConflictError) as info:
        pm.registry(WIDGET_BACKENDS)

    assert str(info.value) == (
        "widget backend 'shared' is registered twice: by alpha (alpha-kv 1.0) and by beta (beta-kv 2.5). "
        "Uninstall one of them, or disable one with RALLYPOINT_DISABLE_PLUGINS=<plugin>"
    )
    assert info.value.providers == ("alpha (alpha-kv 1.0)", "beta (beta-kv 2.5)")
    assert info.value.exit_code == 2


def test_disabling_one_of_two_conflicting_plugins_resolves_the_conflict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_distribution
) -> None:
    make_distribution(tmp_path, dist="alpha-kv", entry_point="alpha", source=_kv_plugin("shared"))
    make_distribution(tmp_path, dist="beta-kv", entry_point="beta", source=_kv_plugin("shared"))
    monkeypatch.syspath_prepend(str(tmp_path))

    pm = get_plugin_manager(environ={"RALLYPOINT_DISABLE_PLUGINS": "alpha"})

    assert pm.registry(WIDGET_BACKENDS).entry("shared").provider.name == "beta"


def test_entry_point_named_like_an_essential_package_is_a_load_failure_not_a_replacement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_distribution
) -> None:
    make_distribution(tmp_path, dist="impostor", entry_point="widgets", source=_kv_plugin("fake"))
    monkeypatch.syspath_prepend(str(tmp_path))

    with pytest.warns(PluginLoadWarning, match="'widgets' is registered twice"):
        pm = get_plugin_manager(environ={})

    assert pm.infos["widgets"].essential is True
    assert pm.get_plugin("widgets") is acme_widgets
    assert [f.info.distribution for f in pm.load_failures] == ["impostor"]
    assert "fake" not in pm.registry(WIDGET_BACKENDS)


def test_same_entry_point_name_from_two_distributions_keeps_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_distribution
) -> None:
    make_distribution(tmp_path / "a", dist="dup-one", entry_point="dup", source=_kv_plugin("one"))
    make_distribution(tmp_path / "b", dist="dup-two", entry_point="dup", source=_kv_plugin("two"))
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    monkeypatch.syspath_prepend(str(tmp_path / "a"))

    with pytest.warns(PluginLoadWarning) as record:
        pm = get_plugin_manager(environ={})

    assert pm.infos["dup"].distribution == "dup-one"
    registry = pm.registry(WIDGET_BACKENDS)
    assert "one" in registry
    assert "two" not in registry
    [failure] = pm.load_failures
    assert failure.info.distribution == "dup-two"
    message = str(failure.error)
    assert "plugin 'dup' is registered twice: by dup (dup-one 1.0) and by dup (dup-two 1.0)" in message
    assert [str(w.message) for w in record] == [message]


# ---------------------------------------------------------------------------------------------
# Broken plugins


def test_plugin_that_fails_to_import_is_a_warning_and_the_others_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_distribution
) -> None:
    make_distribution(
        tmp_path, dist="brokenplug", entry_point="broken", source='raise ImportError("libfoo.so not found")\n'
    )
    make_distribution(tmp_path, dist="fine-kv", entry_point="fine", source=_kv_plugin("fine-kv"))
    monkeypatch.syspath_prepend(str(tmp_path))

    with pytest.warns(PluginLoadWarning) as record:
        pm = get_plugin_manager(environ={})

    expected = (
        "plugin 'broken' (brokenplug 1.0) failed to load: ImportError: libfoo.so not found. "
        "Reinstall it (pip install --force-reinstall brokenplug), or disable it with RALLYPOINT_DISABLE_PLUGINS=broken"
    )
    assert [str(w.message) for w in record] == [expected]
    assert [str(f.error) for f in pm.load_failures] == [expected]
    assert pm.failure_named("broken") is pm.load_failures[0]
    assert pm.get_plugin("broken") is None
    assert "fine-kv" in pm.registry(WIDGET_BACKENDS)
    assert pm.registry(WIDGET_BACKENDS).broken == ("broken",)


def test_essential_package_that_fails_to_import_sets_its_plugins_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_distribution, installed
) -> None:
    installed.add("acme-widgets")  # the working fake is hidden; this one is broken
    make_distribution(
        tmp_path, dist="acme-widgets-broken", entry_point="widgets", source='raise ImportError("half installed")\n',
        group=ESSENTIAL_GROUP,
    )  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))

    with pytest.warns(PluginLoadWarning) as record:
        pm = get_plugin_manager(environ={})

    assert [f.info.name for f in pm.load_failures] == ["widgets", "cogs"]
    assert "ImportError: half installed" in str(record[0].message)
    assert "it implements rallypoint_" in str(pm.load_failures[1].error)
    assert "(essential packages disabled or not loaded: widgets)" in str(pm.load_failures[1].error)


# ---------------------------------------------------------------------------------------------
# Environment controls


def test_disable_plugins_env_skips_entry_points_and_essential_packages() -> None:
    pm = get_plugin_manager(environ={"RALLYPOINT_DISABLE_PLUGINS": "cogs, widgets"})

    assert pm.disabled == frozenset({"cogs", "widgets"})
    assert list(pm.infos) == ["core"]
    assert not hasattr(pm.hook, "rallypoint_widget_backends")  # its hook specs were never added
    assert pm.kinds() == (CLI_COMMANDS,)
    assert pm.registry(WIDGET_BACKENDS).declared is False
    assert pm.load_failures == []  # cogs was disabled, not set aside


def test_disabled_argument_wins_over_the_environment() -> None:
    pm = get_plugin_manager(disabled=["cogs"], environ={"RALLYPOINT_DISABLE_PLUGINS": "widgets"})

    assert "widgets" in pm.infos
    assert "cogs" not in pm.infos


def test_disabled_plugin_passed_in_code_is_not_registered() -> None:
    class Extra:
        @hookimpl
        def rallypoint_widget_backends(self):
            return [acme_widgets.WidgetBackendRecord(name="extra-kv", factory="x:y")]

    pm = get_plugin_manager(plugins={"extra": Extra()}, autoload=False, disabled=["extra"])

    assert "extra-kv" not in pm.registry(WIDGET_BACKENDS)


def test_disabling_an_essential_package_turns_plugins_of_its_hooks_into_load_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_distribution
) -> None:
    make_distribution(tmp_path, dist="other-plugin", entry_point="other", source="X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    with pytest.warns(PluginLoadWarning) as record:
        pm = get_plugin_manager(environ={"RALLYPOINT_DISABLE_PLUGINS": "widgets"})

    assert [f.info.name for f in pm.load_failures] == ["cogs"]
    assert len(record) == 1
    assert pm.get_plugin("cogs") is None
    error = str(pm.load_failures[0].error)
    assert "it implements rallypoint_" in error
    assert "a hook that no installed package declares (essential packages disabled or not loaded: widgets)" in error
    assert pm.registry(WIDGET_BACKENDS).declared is False
    assert "other" in pm.infos  # plugins unrelated to widgets still load


@pytest.mark.parametrize("value", ["1", "yes", "true", "on"])
def test_disable_autoload_env_loads_essential_packages_only(value: str) -> None:
    pm = get_plugin_manager(environ={"RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD": value})

    assert list(pm.infos) == ESSENTIAL_NAMES


@pytest.mark.parametrize("value", ["", "0", "false", "no", "off"])
def test_autoload_stays_on_for_false_like_values(value: str) -> None:
    pm = get_plugin_manager(environ={"RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD": value})

    assert "cogs" in pm.infos


def test_autoload_argument_wins_over_the_environment() -> None:
    pm = get_plugin_manager(autoload=True, environ={"RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD": "1"})

    assert "cogs" in pm.infos


def test_environment_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("RALLYPOINT_DISABLE_PLUGINS", "core")

    pm = get_plugin_manager()

    assert list(pm.infos) == ["widgets"]
    assert pm.essential_names == ESSENTIAL_NAMES
