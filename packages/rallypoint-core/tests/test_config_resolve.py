"""Phase 2 of job config: the declared selectors looked up, plugin options validated once; rendering."""

from __future__ import annotations

import json
import tomllib

import acme_widgets
import pytest
from acme_widgets import CogOptions, WidgetsSection

from rallypoint.core.config import ConfigSection, Section, load_job_config, render_resolved, resolve_config
from rallypoint.core.config.render import resolved_as_dict, toml_value
from rallypoint.core.errors import ConfigError
from rallypoint.core.plugins import PluginLoadWarning, get_plugin_manager, hookimpl
from rallypoint.core.records import BackendRecord
from rallypoint.core.registry import PluginKind

HINT = "Install plugins with pip install rallypoint-<name>; see rallypoint plugins list"


def resolve_error(path: str, pm, environ=None) -> ConfigError:
    loaded = load_job_config(path, pm, environ=environ or {})
    with pytest.raises(ConfigError) as info:
        resolve_config(loaded, pm)
    assert info.value.exit_code == 2
    return info.value


def test_every_selection_resolves_to_its_record_and_provider(job_file, acme_pm, acme_job) -> None:
    text = acme_job + '\n[inspection]\ninspector = "testinspector"\n\n[delivery]\ncourier = "testcourier"\n'
    loaded = load_job_config(job_file(text), acme_pm, environ={})

    resolved = resolve_config(loaded, acme_pm)

    assert list(resolved.selections) == ["widgets.backend", "gadgets.maker", "inspection.inspector", "delivery.courier"]
    for key, name in [
        ("widgets.backend", "testkv"),
        ("gadgets.maker", "testmaker"),
        ("inspection.inspector", "testinspector"),
        ("delivery.courier", "testcourier"),
    ]:
        selection = resolved.selections[key]
        assert resolved.selection(key) is selection
        assert selection.name == name
        assert selection.record is not None
        assert selection.record.name == name
        assert selection.provider is not None
        assert selection.provider.name == "acme"
    options = resolved.selections["widgets.backend"].options
    assert isinstance(options, CogOptions)  # validated once, here, by the record's own model
    assert options.model_dump() == {"endpoints": ["http://10.0.0.5:2379"], "retries": 3, "timeout": 5.0}
    assert resolved.selections["gadgets.maker"].options is None
    assert resolved.config is loaded.config
    assert resolved.section(WidgetsSection) is loaded.config.widgets
    assert resolved.selection("nowhere.thing") is None


def test_alias_selects_the_record(job_file, acme_pm, acme_job) -> None:
    loaded = load_job_config(job_file(acme_job.replace('backend = "testkv"', 'backend = "TKV"')), acme_pm, environ={})

    selection = resolve_config(loaded, acme_pm).selections["widgets.backend"]

    assert selection.name == "TKV"
    assert selection.record is not None
    assert selection.record.name == "testkv"


def test_special_values_of_a_kind_are_not_plugin_names(job_file, acme_pm, acme_job) -> None:
    text = acme_job.replace('maker = "testmaker"', 'maker = "auto"')
    loaded = load_job_config(job_file(text), acme_pm, environ={})

    resolved = resolve_config(loaded, acme_pm)

    auto = resolved.selections["gadgets.maker"]
    assert (auto.record, auto.options) == (None, None)
    assert auto.note == "picked at run time among: testmaker"
    off = resolved.selections["inspection.inspector"]
    assert (off.name, off.record, off.note) == ("off", None, "disabled")


def test_options_given_with_a_special_value_are_refused_not_dropped(job_file, acme_pm, acme_job) -> None:
    # 'auto' picks a plugin at run time: options written for it would reach nothing
    text = acme_job.replace('maker = "testmaker"', 'maker = "auto"\n[gadgets.options]\nspeed = 3\ncolor = "red"')

    error = resolve_error(job_file(text), acme_pm)

    assert str(error) == (
        "job.toml: gadgets.options: gadgets.maker = 'auto' takes no options (color, speed given); "
        "name a gadget maker (testmaker) in gadgets.maker to give it options"
    )


def test_a_special_value_that_needs_a_plugin_says_what_to_install(job_file) -> None:
    pm = get_plugin_manager(autoload=False)  # the widgets subsystem, but no gadget maker
    assert pm.registry(acme_widgets.GADGET_MAKERS).names() == []
    file = job_file('[widgets]\nbackend = "plain"\n[gadgets]\nmaker = "auto"\n')

    error = resolve_error(file, pm)

    assert str(error) == (
        "job.toml: gadgets.maker: 'auto' needs at least one gadget maker, and none is installed; pip install acme-cogs"
    )


def test_a_plugin_name_with_none_of_its_kind_installed_says_what_to_install(job_file) -> None:
    pm = get_plugin_manager(autoload=False)  # the widgets subsystem, but no gadget maker
    file = job_file('[widgets]\nbackend = "plain"\n[gadgets]\nmaker = "testmaker"\n')

    error = resolve_error(file, pm)

    assert str(error) == (
        "job.toml: gadgets.maker: gadget maker 'testmaker' is not installed, and no gadget maker is; "
        "pip install acme-cogs"
    )


def test_an_optional_section_is_resolved_only_when_the_job_has_it(job_file, acme_pm, acme_job) -> None:
    resolved = resolve_config(load_job_config(job_file(acme_job), acme_pm, environ={}), acme_pm)
    assert "delivery.courier" not in resolved.selections
    assert resolved.section_or_none(acme_widgets.DeliverySection) is None

    with_delivery = job_file(acme_job + "\n[delivery]\n", name="delivery.toml")
    error = resolve_error(with_delivery, acme_pm)
    assert str(error) == f"delivery.toml: delivery.courier: unknown courier 'pigeon'; available: testcourier. {HINT}"


def test_unknown_backend_with_did_you_mean(job_file, acme_pm, acme_job) -> None:
    file = job_file(acme_job.replace('backend = "testkv"', 'backend = "testkb"'))

    error = resolve_error(file, acme_pm)

    assert str(error) == (
        "job.toml: widgets.backend: unknown widget backend 'testkb'; available: needy, plain, testkv; "
        f"did you mean 'testkv'? {HINT}"
    )


def test_unknown_names_from_env_are_attributed_to_the_variable(job_file, acme_pm, acme_job) -> None:
    error = resolve_error(job_file(acme_job), acme_pm, environ={"RALLYPOINT_GADGETS_MAKER": "zigzag"})

    [issue] = error.issues
    assert issue.source == "RALLYPOINT_GADGETS_MAKER (environment)"
    assert issue.key == "gadgets.maker"
    assert issue.message == f"unknown gadget maker 'zigzag'; available: testmaker. {HINT}"


def test_bad_plugin_options_are_validated_by_the_plugins_model(job_file, acme_pm, acme_job) -> None:
    text = acme_job.replace(
        'endpoints = ["http://10.0.0.5:2379"]',
        'endpoints = ["http://10.0.0.5:2379", 2380]\nretrys = 2\nretries = -1\ntimeout = "forever"',
    )

    error = resolve_error(job_file(text), acme_pm)

    assert str(error).splitlines() == [
        "job.toml: widgets.options.endpoints[1]: expected a string, got 2380",
        "job.toml: widgets.options.retries: must be at least 0, got -1",
        'job.toml: widgets.options.timeout: invalid duration \'forever\' (write e.g. "10m" or "30s")',
        "job.toml: widgets.options.retrys: unknown key 'retrys'; did you mean 'retries'? "
        "(known keys: endpoints, retries, timeout)",
    ]


def test_missing_required_option(job_file, acme_pm, acme_job) -> None:
    text = acme_job.replace('endpoints = ["http://10.0.0.5:2379"]', "retries = 1")

    error = resolve_error(job_file(text), acme_pm)

    assert str(error) == "job.toml: widgets.options.endpoints: required key is missing"


def test_plugin_option_error_from_env_names_the_variable(job_file, acme_pm, acme_job) -> None:
    environ = {"RALLYPOINT_WIDGETS_OPTIONS_ENDPOINTS": '["ok", 3]'}

    error = resolve_error(job_file(acme_job), acme_pm, environ=environ)

    assert str(error) == (
        "RALLYPOINT_WIDGETS_OPTIONS_ENDPOINTS (environment): widgets.options.endpoints[1]: expected a string, got 3"
    )


def test_options_given_to_a_plugin_that_takes_none(job_file, acme_pm, acme_job) -> None:
    text = acme_job.replace('maker = "testmaker"', 'maker = "testmaker"\n[gadgets.options]\nzeta = 1\nalpha = 2')

    error = resolve_error(job_file(text), acme_pm)

    assert str(error) == "job.toml: gadgets.options: gadget maker 'testmaker' takes no options; remove alpha, zeta"


def test_missing_requirement_names_the_pip_install(job_file, acme_pm, acme_job) -> None:
    text = acme_job.replace('backend = "testkv"', 'backend = "needy"').replace(
        '[widgets.options]\nendpoints = ["http://10.0.0.5:2379"]\n', ""
    )

    error = resolve_error(job_file(text), acme_pm)

    assert str(error) == (
        "job.toml: widgets.backend: widget backend 'needy' needs the Python module "
        "'surely_not_installed_mod', which is not installed. Install it with: pip install x"
    )


def test_all_phase_two_problems_are_reported_together(job_file, acme_pm, acme_job) -> None:
    text = (
        acme_job.replace('backend = "testkv"', 'backend = "needy"').replace('maker = "testmaker"', 'maker = "testmakr"')
        + '\n[inspection]\ninspector = "testinspectr"\n'
    )

    error = resolve_error(job_file(text), acme_pm)

    assert [i.key for i in error.issues] == [
        "widgets.backend",
        "widgets.options",
        "gadgets.maker",
        "inspection.inspector",
    ]
    assert "did you mean 'testmaker'?" in error.issues[2].message
    assert "did you mean 'testinspector'?" in error.issues[3].message


def test_selecting_a_plugin_that_failed_to_load_explains_why(job_file, acme_job, acme_plugin) -> None:
    class Broken:
        @hookimpl
        def rallypoint_gadget_makers(self):
            raise ImportError("needs numpy")

    pm = get_plugin_manager(plugins={"acme": acme_plugin, "fancymaker": Broken()}, autoload=False)
    with pytest.warns(PluginLoadWarning, match="plugin 'fancymaker'"):
        pm.registry(acme_widgets.GADGET_MAKERS)  # calling the hook is what fails
    file = job_file(acme_job.replace('maker = "testmaker"', 'maker = "fancymaker"'))

    error = resolve_error(file, pm)

    assert str(error) == (
        "job.toml: gadgets.maker: plugin 'fancymaker' (fancymaker) failed to load: ImportError: needs numpy. "
        "Reinstall it (pip install --force-reinstall fancymaker), or disable it with "
        "RALLYPOINT_DISABLE_PLUGINS=fancymaker"
    )


# ---------------------------------------------------------------------------------------------
# Selectors come from the declared kinds


class TrayKindWithoutHookspec:
    """Declares a kind and its section but forgets to add the kind's hook specification."""

    class TraySection(Section):
        stacker: str = "flat"

    @hookimpl
    def rallypoint_plugin_kinds(self):
        return [
            PluginKind(hook="rallypoint_tray_stackers", label="tray stacker", record_class=BackendRecord,
                       config_key="trays.stacker"),
            PluginKind(hook="rallypoint_lid_fitters", label="lid fitter", record_class=BackendRecord,
                       config_key="lids.fitter"),
        ]  # fmt: skip

    @hookimpl
    def rallypoint_config_sections(self):
        return [ConfigSection("trays", self.TraySection)]


def test_a_kind_without_a_hook_specification_cannot_be_selected(job_file, acme_plugin) -> None:
    pm = get_plugin_manager(plugins={"acme": acme_plugin, "trays": TrayKindWithoutHookspec()}, autoload=False)
    loaded = load_job_config(job_file("[trays]\n"), pm, environ={})

    with pytest.raises(ConfigError) as info:
        resolve_config(loaded, pm)

    assert str(info.value) == (
        "job.toml: trays.stacker: tray stacker 'flat' cannot be found: no installed package declares the hook "
        "rallypoint_tray_stackers"
    )
    assert "lids.fitter" not in [i.key for i in info.value.issues]  # no [lids] section: not a selector


def test_core_alone_resolves_a_job_without_sections(job_file, core_alone) -> None:
    pm = get_plugin_manager(environ={})

    resolved = resolve_config(load_job_config(job_file(""), pm, environ={}), pm)

    assert resolved.selections == {}
    assert render_resolved(resolved) == (
        "# no sections: no installed package declares one (see rallypoint plugins list)\n"
    )


# ---------------------------------------------------------------------------------------------
# Rendering


def test_render_shows_each_value_with_its_source(job_file, acme_pm, acme_job) -> None:
    loaded = load_job_config(
        job_file(acme_job),
        acme_pm,
        environ={"RALLYPOINT_WIDGETS_MAX": "4"},
        overrides=[("widgets.join_timeout", "5m", "--set widgets.join_timeout (command line)")],
    )

    text = render_resolved(resolve_config(loaded, acme_pm))
    lines = text.splitlines()

    assert 'name = "demo"  # job.toml' in lines
    assert "tags = []  # default" in lines
    assert "max = 4  # RALLYPOINT_WIDGETS_MAX (environment)" in lines
    assert "min = 1  # default" in lines
    assert 'backend = "testkv"  # job.toml; acme' in lines
    assert 'join_timeout = "5m"  # --set widgets.join_timeout (command line)' in lines
    assert 'grace = "5s"  # default' in lines  # [widgets] is in the file, this key is not
    assert "[widgets.options]" in lines
    assert 'endpoints = ["http://10.0.0.5:2379"]  # job.toml' in lines
    assert "retries = 3  # default" in lines
    assert 'maker = "testmaker"  # job.toml; acme' in lines
    assert 'inspector = "off"  # default; disabled' in lines
    assert "[delivery]" not in lines
    assert text.endswith("\n")


def test_rendered_toml_loads_back_to_the_same_job(job_file, acme_pm, acme_job, tmp_path) -> None:
    text = acme_job.replace("[gadgets]", '[gadgets]\ntimeout = "250ms"') + '\n[widgets.env]\n"WEIRD KEY" = "v"\n'
    loaded = load_job_config(job_file(text), acme_pm, environ={})
    rendered = render_resolved(resolve_config(loaded, acme_pm))

    (tmp_path / "again.toml").write_text(rendered)
    again = load_job_config("again.toml", acme_pm, environ={})

    assert tomllib.loads(rendered)["gadgets"]["timeout"] == "250ms"
    # the same job, except that the rendered options carry the plugin's defaults
    skip = {"widgets": {"options"}}
    assert again.config.model_dump(exclude=skip) == loaded.config.model_dump(exclude=skip)
    assert again.config.widgets.name == "demo"
    assert again.config.widgets.env == {"WEIRD KEY": "v"}
    assert again.config.widgets.options == {"endpoints": ["http://10.0.0.5:2379"], "retries": 3, "timeout": "5s"}
    assert resolve_config(again, acme_pm).selections["widgets.backend"].options == (
        resolve_config(loaded, acme_pm).selections["widgets.backend"].options
    )


def test_resolved_as_dict_is_json_with_plugins(job_file, acme_pm, acme_job) -> None:
    loaded = load_job_config(job_file(acme_job), acme_pm, environ={})

    data = resolved_as_dict(resolve_config(loaded, acme_pm))

    json.dumps(data)  # plain data
    assert data["widgets"]["join_timeout"] == "10m"
    assert data["widgets"]["options"] == {"endpoints": ["http://10.0.0.5:2379"], "retries": 3, "timeout": "5s"}
    assert data["plugins"]["widgets.backend"] == {"name": "testkv", "provider": "acme", "note": None}
    assert data["plugins"]["inspection.inspector"] == {"name": "off", "provider": None, "note": "disabled"}
    assert "delivery" not in data


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (True, "true"),
        (3, "3"),
        (2.5, "2.5"),
        ('a"b', '"a\\"b"'),
        (["a", 1], '["a", 1]'),
        ({}, "{}"),
        ({"x": 1, "two words": "y"}, '{ x = 1, "two words" = "y" }'),
    ],
)
def test_toml_value(value: object, text: str) -> None:
    assert toml_value(value) == text
    assert tomllib.loads(f"v = {text}")["v"] == value
