"""The plugin manager: built-ins, entry points, historic hook specs, validation, env controls."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pluggy
import pytest

from rallypoint.core.errors import PluginConflictError
from rallypoint.core.plugins import (
    BUILTIN_PLUGINS,
    PluginLoadWarning,
    get_plugin_manager,
    hookimpl,
    hookspec,
)
from rallypoint.core.records import BackendRecord
from rallypoint.core.registry import CLI_COMMANDS, COLLECTIVE_BACKENDS, RENDEZVOUS_BACKENDS, PluginKind
from rallypoint.rendezvous.records import RendezvousBackendRecord

BUILTIN_NAMES = ["core", "rendezvous", "agent", "timer", "collectives", "rpc"]
#: The plugins shipped in this monorepo's plugins/ directory (installed in the workspace env).
MONOREPO_PLUGINS = ["etcd", "file", "gloo", "grpc", "nccl", "ranks"]


def test_builtins_are_registered_without_entry_points() -> None:
    pm = get_plugin_manager(autoload=False)

    assert [b.name for b in BUILTIN_PLUGINS] == BUILTIN_NAMES
    assert list(pm.infos) == BUILTIN_NAMES
    for name in BUILTIN_NAMES:
        info = pm.infos[name]
        assert pm.get_plugin(name) is not None
        assert info.builtin is True
        assert info.distribution == f"rallypoint-{name}"
        assert info.version == importlib.metadata.version(f"rallypoint-{name}")
    assert pm.load_failures == []


def test_builtins_declare_their_subsystem_hooks() -> None:
    pm = get_plugin_manager(autoload=False)

    for hook in (
        "rallypoint_addhooks",
        "rallypoint_cli_commands",
        "rallypoint_rendezvous_backends",
        "rallypoint_rendezvous_completed",
        "rallypoint_rendezvous_timed_out",
        "rallypoint_rank_strategies",
        "rallypoint_agent_should_restart",
        "rallypoint_worker_env",
        "rallypoint_timer_backends",
        "rallypoint_collective_backends",
        "rallypoint_rpc_transports",
    ):
        assert getattr(pm.hook, hook).has_spec(), hook
    assert pm.hook.rallypoint_agent_should_restart.spec.opts["firstresult"] is True


def test_core_registers_the_plugins_and_config_commands() -> None:
    pm = get_plugin_manager(autoload=False)

    registry = pm.registry(CLI_COMMANDS)
    core_commands = [e.record.name for e in registry.entries() if e.provider.name == "core"]
    assert core_commands == ["plugins", "config"]
    # the other framework packages contribute theirs through the same hook
    assert registry.entry("run").provider.name == "agent"
    assert registry.entry("timeline").provider.name == "timer"


def test_entry_point_plugins_of_the_monorepo_are_loaded() -> None:
    pm = get_plugin_manager(environ={})

    assert list(pm.infos)[: len(BUILTIN_NAMES)] == BUILTIN_NAMES
    for name in MONOREPO_PLUGINS:
        info = pm.infos[name]
        assert info.builtin is False
        assert info.distribution == f"rallypoint-{name}"
        assert pm.get_plugin(name) is not None
    gloo = pm.registry(COLLECTIVE_BACKENDS).entry("gloo")
    assert gloo.provider.describe() == f"gloo (rallypoint-gloo {importlib.metadata.version('rallypoint-gloo')})"


def test_third_party_entry_point_is_registered_with_its_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_distribution
) -> None:
    make_distribution(
        tmp_path,
        dist="acme-rendezvous",
        version="2.3.1",
        entry_point="acme",
        source="""
            from rallypoint.core.plugins import hookimpl
            from rallypoint.rendezvous.records import RendezvousBackendRecord

            @hookimpl
            def rallypoint_rendezvous_backends():
                return [RendezvousBackendRecord(name="acme-kv", factory="acme:Backend")]
        """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    pm = get_plugin_manager(environ={})

    assert pm.infos["acme"].distribution == "acme-rendezvous"
    assert pm.infos["acme"].version == "2.3.1"
    entry = pm.registry(RENDEZVOUS_BACKENDS).entry("acme-kv")
    assert entry.provider.describe() == "acme (acme-rendezvous 2.3.1)"


def test_plugins_argument_registers_objects_by_name(acme_pm) -> None:
    assert "acme" in acme_pm.infos
    assert acme_pm.infos["acme"].distribution is None
    assert acme_pm.registry(RENDEZVOUS_BACKENDS).entry("testkv").provider.name == "acme"


def test_each_call_builds_a_fresh_manager() -> None:
    class Extra:
        @hookimpl
        def rallypoint_rendezvous_backends(self):
            return [RendezvousBackendRecord(name="only-here", factory="x:y")]

    with_extra = get_plugin_manager(plugins={"extra": Extra()}, autoload=False)
    without = get_plugin_manager(autoload=False)

    assert with_extra is not without
    assert "only-here" in with_extra.registry(RENDEZVOUS_BACKENDS)
    assert "only-here" not in without.registry(RENDEZVOUS_BACKENDS)


# ---------------------------------------------------------------------------------------------
# Historic rallypoint_addhooks


class WidgetSpecs:
    @hookspec
    def rallypoint_widgets(self):
        """Register widgets (a hook of a made-up subsystem)."""


class WidgetSubsystem:
    """Adds the widget hook specification through the historic bootstrap hook."""

    def __init__(self) -> None:
        self.called_with: list[object] = []

    @hookimpl
    def rallypoint_addhooks(self, pluginmanager):
        self.called_with.append(pluginmanager)
        pluginmanager.add_hookspecs(WidgetSpecs)


class WidgetMaker:
    @hookimpl
    def rallypoint_widgets(self):
        return [BackendRecord(name="gear")]


def test_addhooks_is_historic_and_lets_a_plugin_add_hook_specs() -> None:
    subsystem = WidgetSubsystem()
    # The implementation is registered before the plugin that declares its specification.
    pm = get_plugin_manager(plugins={"maker": WidgetMaker(), "widgets": subsystem}, autoload=False)

    assert subsystem.called_with == [pm]  # called although registered after the historic call
    assert pm.hook.rallypoint_widgets.has_spec()
    assert pm.hook.rallypoint_widgets() == [[BackendRecord(name="gear")]]
    kind = PluginKind("rallypoint_widgets", "widget", "widget-dist", BackendRecord)
    assert pm.registry(kind).names() == ["gear"]


def test_addhooks_reaches_plugins_registered_after_the_manager_was_built() -> None:
    pm = get_plugin_manager(autoload=False)
    subsystem = WidgetSubsystem()

    pm.register(subsystem, name="late")

    assert subsystem.called_with == [pm]
    assert pm.hook.rallypoint_widgets.has_spec()


# ---------------------------------------------------------------------------------------------
# check_pending


class Misspelled:
    @hookimpl
    def rallypoint_rendezvous_backend(self):  # missing the final "s"
        return []


def test_misspelled_hookimpl_is_an_error() -> None:
    with pytest.raises(
        pluggy.PluginValidationError,
        match=r"implements 'rallypoint_rendezvous_backend', .* did you mean 'rallypoint_rendezvous_backends'\?",
    ):
        get_plugin_manager(plugins={"typo": Misspelled()}, autoload=False)


def test_hookimpl_with_an_argument_the_spec_lacks_is_an_error() -> None:
    class BadSignature:
        @hookimpl
        def rallypoint_rendezvous_backends(self, config):
            return []

    with pytest.raises(pluggy.PluginValidationError, match="config"):
        get_plugin_manager(plugins={"bad": BadSignature()}, autoload=False)


def test_misspelled_hook_in_an_entry_point_plugin_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_distribution
) -> None:
    make_distribution(
        tmp_path,
        dist="typo-plugin",
        entry_point="typo",
        source="""
            from rallypoint.core.plugins import hookimpl

            @hookimpl
            def rallypoint_rank_strategy():
                return []
        """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    with pytest.raises(
        pluggy.PluginValidationError,
        match=r"implements 'rallypoint_rank_strategy', a hook that no .* did you mean 'rallypoint_rank_strategies'\?",
    ):
        get_plugin_manager(environ={})


# ---------------------------------------------------------------------------------------------
# Conflicts


def _kv_plugin(name: str, version: str) -> str:
    return f"""
        from rallypoint.core.plugins import hookimpl
        from rallypoint.rendezvous.records import RendezvousBackendRecord

        @hookimpl
        def rallypoint_rendezvous_backends():
            return [RendezvousBackendRecord(name="{name}", factory="x:y")]
    """


def test_two_distributions_registering_one_name_conflict_naming_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_distribution
) -> None:
    make_distribution(tmp_path, dist="alpha-kv", version="1.0", entry_point="alpha", source=_kv_plugin("shared", "1"))
    make_distribution(tmp_path, dist="beta-kv", version="2.5", entry_point="beta", source=_kv_plugin("Shared", "2"))
    monkeypatch.syspath_prepend(str(tmp_path))
    pm = get_plugin_manager(environ={})

    with pytest.raises(PluginConflictError) as info:
        pm.registry(RENDEZVOUS_BACKENDS)

    assert str(info.value) == (
        "rendezvous backend 'shared' is registered twice: by alpha (alpha-kv 1.0) and by beta (beta-kv 2.5). "
        "Uninstall one of them, or disable one with RALLYPOINT_DISABLE_PLUGINS=<plugin>"
    )
    assert info.value.providers == ("alpha (alpha-kv 1.0)", "beta (beta-kv 2.5)")
    assert info.value.exit_code == 2


def test_disabling_one_of_two_conflicting_plugins_resolves_the_conflict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_distribution
) -> None:
    make_distribution(tmp_path, dist="alpha-kv", entry_point="alpha", source=_kv_plugin("shared", "1"))
    make_distribution(tmp_path, dist="beta-kv", entry_point="beta", source=_kv_plugin("shared", "2"))
    monkeypatch.syspath_prepend(str(tmp_path))

    pm = get_plugin_manager(environ={"RALLYPOINT_DISABLE_PLUGINS": "alpha"})

    assert pm.registry(RENDEZVOUS_BACKENDS).entry("shared").provider.name == "beta"


def test_entry_point_named_like_a_builtin_is_a_load_failure_not_a_replacement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_distribution
) -> None:
    make_distribution(tmp_path, dist="impostor", entry_point="rendezvous", source=_kv_plugin("fake", "1"))
    monkeypatch.syspath_prepend(str(tmp_path))

    with pytest.warns(PluginLoadWarning, match="'rendezvous' is registered twice"):
        pm = get_plugin_manager(environ={})

    assert pm.infos["rendezvous"].builtin is True
    assert [f.info.distribution for f in pm.load_failures] == ["impostor"]
    assert "fake" not in pm.registry(RENDEZVOUS_BACKENDS)


def test_same_entry_point_name_from_two_distributions_keeps_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_distribution
) -> None:
    make_distribution(tmp_path / "a", dist="dup-one", entry_point="dup", source=_kv_plugin("one", "1"))
    make_distribution(tmp_path / "b", dist="dup-two", entry_point="dup", source=_kv_plugin("two", "1"))
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    monkeypatch.syspath_prepend(str(tmp_path / "a"))

    with pytest.warns(PluginLoadWarning) as record:
        pm = get_plugin_manager(environ={})

    assert pm.infos["dup"].distribution == "dup-one"
    registry = pm.registry(RENDEZVOUS_BACKENDS)
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
    make_distribution(tmp_path, dist="fine-kv", entry_point="fine", source=_kv_plugin("fine-kv", "1"))
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
    assert "fine-kv" in pm.registry(RENDEZVOUS_BACKENDS)
    assert pm.registry(RENDEZVOUS_BACKENDS).broken == ("broken",)


# ---------------------------------------------------------------------------------------------
# Environment controls


def test_disable_plugins_env_skips_entry_points_and_builtins() -> None:
    pm = get_plugin_manager(environ={"RALLYPOINT_DISABLE_PLUGINS": "gloo, etcd,rpc"})

    assert pm.disabled == frozenset({"gloo", "etcd", "rpc"})
    for name in ("gloo", "etcd", "rpc"):
        assert name not in pm.infos
        assert pm.get_plugin(name) is None
    assert not hasattr(pm.hook, "rallypoint_rpc_transports")  # its hook specs were never added
    assert "gloo" not in pm.registry(COLLECTIVE_BACKENDS)
    assert "nccl" in pm.registry(COLLECTIVE_BACKENDS)
    assert pm.load_failures == []


def test_disabled_argument_wins_over_the_environment() -> None:
    pm = get_plugin_manager(disabled=["nccl"], environ={"RALLYPOINT_DISABLE_PLUGINS": "gloo"})

    assert "gloo" in pm.infos
    assert "nccl" not in pm.infos


def test_disabled_plugin_passed_in_code_is_not_registered() -> None:
    class Extra:
        @hookimpl
        def rallypoint_rendezvous_backends(self):
            return [RendezvousBackendRecord(name="extra-kv", factory="x:y")]

    pm = get_plugin_manager(plugins={"extra": Extra()}, autoload=False, disabled=["extra"])

    assert "extra-kv" not in pm.registry(RENDEZVOUS_BACKENDS)


def test_disabling_a_builtin_turns_plugins_of_its_hooks_into_load_failures() -> None:
    with pytest.warns(PluginLoadWarning) as record:
        pm = get_plugin_manager(environ={"RALLYPOINT_DISABLE_PLUGINS": "collectives"})

    assert sorted(f.info.name for f in pm.load_failures) == ["gloo", "nccl"]
    assert len(record) == 2
    for failure in pm.load_failures:
        assert pm.get_plugin(failure.info.name) is None
        assert "it implements rallypoint_collective_backends, a hook that no installed package declares" in str(
            failure.error
        )
        assert "disabled or not installed: collectives" in str(failure.error)
    assert pm.registry(COLLECTIVE_BACKENDS).declared is False
    assert "file" in pm.infos  # plugins unrelated to collectives still load


@pytest.mark.parametrize("value", ["1", "yes", "true", "on"])
def test_disable_autoload_env_loads_builtins_only(value: str) -> None:
    pm = get_plugin_manager(environ={"RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD": value})

    assert list(pm.infos) == BUILTIN_NAMES


@pytest.mark.parametrize("value", ["", "0", "false", "no", "off"])
def test_autoload_stays_on_for_false_like_values(value: str) -> None:
    pm = get_plugin_manager(environ={"RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD": value})

    assert set(MONOREPO_PLUGINS) <= set(pm.infos)


def test_autoload_argument_wins_over_the_environment() -> None:
    pm = get_plugin_manager(autoload=True, environ={"RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD": "1"})

    assert "gloo" in pm.infos


def test_environment_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("RALLYPOINT_DISABLE_PLUGINS", "timer")

    pm = get_plugin_manager()

    assert list(pm.infos) == ["core", "rendezvous", "agent", "collectives", "rpc"]
