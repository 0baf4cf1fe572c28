"""Phase 1 of job config: sections declared by packages, layering defaults < file < env < CLI, exact messages.

The sections are those of the made-up widgets subsystem (``tests/installed/acme_widgets.py``):
``[widgets]``, ``[gadgets]``, ``[inspection]`` and the optional ``[delivery]``.
"""

from __future__ import annotations

from pathlib import Path

import acme_widgets
import pytest
from acme_widgets import DeliverySection, GadgetsSection, WidgetsSection

from rallypoint.core.config import ConfigSection, Section, build_schema, load_job_config, parse_value
from rallypoint.core.config.loader import env_overrides
from rallypoint.core.errors import ConfigError, PluginError
from rallypoint.core.plugins import get_plugin_manager

SCHEMA = build_schema(acme_widgets.SECTIONS)
MISSING_PACKAGE = (
    "Sections are declared by installed packages: if [{name}] belongs to one that is missing or disabled, "
    "install or enable it (see rallypoint plugins list)"
)

FULL_JOB = """\
[widgets]
name = "mnist"
backend = "cog"
min = 2
max = 4
tags = ["--epochs", "3"]
env = { OMP_NUM_THREADS = "4" }
join_timeout = "10m"
grace = "250ms"
[widgets.options]
endpoints = ["http://10.0.0.5:2379"]

[gadgets]
maker = "lathe"
timeout = "60s"
[gadgets.options]
order = ["rack", "host"]

[inspection]
inspector = "loupe"
verbose = true

[delivery]
courier = "pigeon"
mode = "fast"
"""


def load(path: str | None, **kwargs):
    return load_job_config(path, SCHEMA, **kwargs)


def load_error(path: str | None, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(path, **kwargs)
    assert info.value.exit_code == 2
    return info.value


# ---------------------------------------------------------------------------------------------
# Every section


def test_every_section_loads_from_toml(job_file) -> None:
    loaded = load(job_file(FULL_JOB), environ={})
    c = loaded.config

    assert loaded.path == Path("job.toml")
    assert loaded.schema is SCHEMA
    w = c.widgets
    assert (w.name, w.backend, w.min, w.max) == ("mnist", "cog", 2, 4)
    assert w.tags == ["--epochs", "3"]
    assert w.env == {"OMP_NUM_THREADS": "4"}
    assert (w.join_timeout, w.grace) == (600.0, 0.25)
    assert w.options == {"endpoints": ["http://10.0.0.5:2379"]}
    assert (c.gadgets.maker, c.gadgets.timeout, c.gadgets.options) == ("lathe", 60.0, {"order": ["rack", "host"]})
    assert (c.inspection.inspector, c.inspection.verbose) == ("loupe", True)
    assert c.delivery is not None
    assert (c.delivery.courier, c.delivery.mode) == ("pigeon", "fast")
    assert loaded.source_of("delivery.mode") == "job.toml"


def test_defaults() -> None:
    loaded = load(None, environ={})
    c = loaded.config

    assert loaded.path is None
    assert (c.widgets.name, c.widgets.backend, c.widgets.min, c.widgets.max) == (None, "plain", 1, None)
    assert c.widgets.join_timeout == 600.0
    assert (c.gadgets.maker, c.gadgets.timeout) == ("auto", 600.0)
    assert (c.inspection.inspector, c.inspection.verbose) == ("off", False)
    assert c.delivery is None  # optional: absent unless the job has it
    assert loaded.sources == {}
    assert loaded.source_of("widgets.min") == "default"


def test_the_schema_is_what_the_installed_packages_declare(job_file) -> None:
    pm = get_plugin_manager(environ={})

    assert pm.job_schema() is SCHEMA  # built once per set of sections
    assert pm.job_schema().names == ("widgets", "gadgets", "inspection", "delivery")
    loaded = load_job_config(job_file(FULL_JOB), pm, environ={})
    assert loaded.schema is SCHEMA
    assert loaded.config.model_dump() == load(job_file(FULL_JOB), environ={}).config.model_dump()


def test_typed_section_accessors(job_file) -> None:
    loaded = load(job_file("[widgets]\nmin = 3\n"), environ={})

    widgets = loaded.section(WidgetsSection)
    assert isinstance(widgets, WidgetsSection)
    assert widgets is loaded.config.widgets
    assert widgets.min == 3
    assert loaded.section(GadgetsSection).maker == "auto"
    assert loaded.section_or_none(DeliverySection) is None
    with pytest.raises(LookupError, match=r"the job has no \[delivery\] section"):
        loaded.section(DeliverySection)

    class Stranger(Section):
        pass

    with pytest.raises(LookupError) as info:
        loaded.section(Stranger)
    assert str(info.value) == (
        "no installed package declares a job-file section with model Stranger "
        "(declared: widgets, gadgets, inspection, delivery)"
    )


@pytest.mark.parametrize(("value", "seconds"), [('"250ms"', 0.25), ('"1h30m"', 5400.0), ("45", 45.0), ("0.5", 0.5)])
def test_durations_in_the_file(job_file, value: str, seconds: float) -> None:
    loaded = load(job_file(f"[gadgets]\ntimeout = {value}\n"), environ={})

    assert loaded.config.gadgets.timeout == seconds


# ---------------------------------------------------------------------------------------------
# Sections and schemas


def test_core_alone_knows_no_section(job_file, core_alone) -> None:
    pm = get_plugin_manager(environ={})

    empty = load_job_config(job_file(""), pm, environ={"RALLYPOINT_WIDGETS_MIN": "2"})
    assert empty.config.model_dump() == {}
    assert empty.sources == {}  # not a declared section: not configuration

    with pytest.raises(ConfigError) as info:
        load_job_config(job_file("[widgets]\nmin = 2\n"), pm, environ={})
    assert str(info.value) == (
        "job.toml: widgets: unknown section [widgets] (known sections: none). " + MISSING_PACKAGE.format(name="widgets")
    )


@pytest.mark.parametrize(
    ("name", "model", "problem"),
    [
        ("two_words", WidgetsSection, "use lower case letters and digits, starting with a letter"),
        ("Widgets", WidgetsSection, "use lower case letters and digits, starting with a letter"),
        ("9lives", WidgetsSection, "use lower case letters and digits, starting with a letter"),
        ("disable", WidgetsSection, "the name is reserved"),
        ("copy", WidgetsSection, "the name is reserved"),
        ("widgets", dict, "its model <class 'dict'> is not a rallypoint.core.config.Section subclass"),
    ],
)
def test_invalid_sections_are_refused(name: str, model: type, problem: str) -> None:
    with pytest.raises(PluginError) as info:
        ConfigSection(name, model)

    assert str(info.value) == f"invalid config section {name!r}: {problem}"


def test_a_debug_section_reads_its_keys_but_never_the_traceback_switch() -> None:
    """``RALLYPOINT_DEBUG=1`` (core's traceback switch) names no key: never configuration, even with ``[debug]``."""

    class HangSection(Section):
        hang_timeout: float | None = None

    section = ConfigSection("debug", HangSection)  # the agent declares [debug] (#40): the name is not reserved
    environ = {"RALLYPOINT_DEBUG": "1", "RALLYPOINT_DEBUG_HANG_TIMEOUT": "30"}

    assert env_overrides(environ, [section.name]) == [
        ("debug.hang_timeout", 30, "RALLYPOINT_DEBUG_HANG_TIMEOUT (environment)")
    ]


def test_schema_is_cached_per_set_of_sections_and_refuses_duplicates() -> None:
    sections = list(acme_widgets.SECTIONS)

    assert build_schema(sections) is build_schema(tuple(sections))
    assert build_schema(sections[:2]) is not build_schema(sections)
    assert build_schema(sections[:2]).names == ("widgets", "gadgets")
    assert build_schema(sections).get("delivery") is sections[3]
    assert build_schema(sections).name_of(GadgetsSection) == "gadgets"
    with pytest.raises(PluginError, match=r"config section \[widgets\] is declared twice"):
        build_schema([sections[0], ConfigSection("widgets", GadgetsSection)])


def test_schema_model_forbids_extra_keys_in_plain_python() -> None:
    assert SCHEMA.model.model_validate({"widgets": {"min": 2, "max": 4}}).widgets.max == 4
    with pytest.raises(ValueError, match="extra"):
        SCHEMA.model.model_validate({"widgets": {"mn": 2}})


# ---------------------------------------------------------------------------------------------
# Layering


LAYERED = """\
[widgets]
min = 1
max = 2
join_timeout = "1m"
grace = "45s"
"""


def test_layering_defaults_file_env_cli(job_file) -> None:
    environ = {
        "RALLYPOINT_WIDGETS_MAX": "3",
        "RALLYPOINT_WIDGETS_JOIN_TIMEOUT": "5m",
        "RALLYPOINT_WIDGETS_NAME": "from-env",
        "RALLYPOINT_DISABLE_PLUGINS": "cogs",  # a control, not configuration
        "RALLYPOINT_DEBUG": "1",
        "UNRELATED": "x",
    }
    overrides = [("widgets.max", 4, "--set widgets.max (command line)")]

    loaded = load(job_file(LAYERED), environ=environ, overrides=overrides)
    c = loaded.config

    assert c.widgets.max == 4
    assert loaded.source_of("widgets.max") == "--set widgets.max (command line)"
    assert c.widgets.join_timeout == 300.0
    assert loaded.source_of("widgets.join_timeout") == "RALLYPOINT_WIDGETS_JOIN_TIMEOUT (environment)"
    assert c.widgets.name == "from-env"
    assert loaded.source_of("widgets.name") == "RALLYPOINT_WIDGETS_NAME (environment)"
    assert c.widgets.grace == 45.0
    assert loaded.source_of("widgets.grace") == "job.toml"
    assert c.widgets.min == 1
    assert loaded.source_of("widgets.min") == "job.toml"
    assert c.gadgets.timeout == 600.0
    assert loaded.source_of("gadgets.timeout") == "default"
    assert loaded.source_of("widgets.tags", inherit=False) == "default"
    assert loaded.is_explicit("widgets")
    assert not loaded.is_explicit("gadgets")


def test_environment_defaults_to_os_environ(job_file, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RALLYPOINT_WIDGETS_MAX", "7")

    loaded = load(job_file(LAYERED))

    assert loaded.config.widgets.max == 7
    assert loaded.source_of("widgets.max") == "RALLYPOINT_WIDGETS_MAX (environment)"


def test_env_values_are_read_as_toml_values() -> None:
    environ = {
        "RALLYPOINT_WIDGETS_TAGS": '["--lr", "0.1"]',
        "RALLYPOINT_INSPECTION_VERBOSE": "true",
        "RALLYPOINT_WIDGETS_MIN": "3",
        "RALLYPOINT_GADGETS_MAKER": "lathe",
        "RALLYPOINT_WIDGETS_GRACE": "2m",
    }

    c = load(None, environ=environ).config

    assert c.widgets.tags == ["--lr", "0.1"]
    assert c.inspection.verbose is True
    assert c.widgets.min == 3
    assert c.gadgets.maker == "lathe"
    assert c.widgets.grace == 120.0


def test_env_sets_plugin_options(job_file) -> None:
    file = job_file('[widgets]\nbackend = "cog"\n[widgets.options]\nendpoints = ["a"]\nprefix = "/rp"\n')
    environ = {"RALLYPOINT_WIDGETS_OPTIONS_ENDPOINTS": '["b", "c"]', "RALLYPOINT_GADGETS_OPTIONS_ORDER_BY": "rack"}

    loaded = load(file, environ=environ)

    assert loaded.config.widgets.options == {"endpoints": ["b", "c"], "prefix": "/rp"}
    assert loaded.config.gadgets.options == {"order_by": "rack"}
    assert loaded.source_of("widgets.options.endpoints") == "RALLYPOINT_WIDGETS_OPTIONS_ENDPOINTS (environment)"
    assert loaded.source_of("widgets.options.prefix") == "job.toml"


def test_env_overrides_parsing() -> None:
    assert env_overrides(
        {
            "RALLYPOINT_WIDGETS_MAX": "4",
            "RALLYPOINT_DISABLE_PLUGINS": "x",
            "RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD": "1",
            "RALLYPOINT_WIDGETS": "3",
            "RALLYPOINT_NODES_MAX": "3",  # no installed package declares [nodes]
            "RALLYPOINT_DELIVERY_OPTIONS_TOKEN_FILE": "/run/token",
            "rallypoint_widgets_min": "2",
        },
        SCHEMA.names,
    ) == [
        ("delivery.options.token_file", "/run/token", "RALLYPOINT_DELIVERY_OPTIONS_TOKEN_FILE (environment)"),
        ("widgets.max", 4, "RALLYPOINT_WIDGETS_MAX (environment)"),
    ]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4", 4),
        ("2.5", 2.5),
        ("true", True),
        ("5m", "5m"),
        ("lathe", "lathe"),
        ('"quoted"', "quoted"),
        ('["a", "b"]', ["a", "b"]),
        ("{ x = 1 }", {"x": 1}),
        ("", ""),
    ],
)
def test_parse_value(text: str, value: object) -> None:
    assert parse_value(text) == value


def test_override_replacing_a_table_forgets_where_the_old_keys_came_from(job_file) -> None:
    file = job_file('[widgets.options]\nendpoints = ["a"]\nprefix = "/rp"\n')
    overrides = [("widgets.options", {"endpoints": ["z"]}, "--set widgets.options (command line)")]

    loaded = load(file, environ={}, overrides=overrides)

    assert loaded.config.widgets.options == {"endpoints": ["z"]}
    assert loaded.source_of("widgets.options.endpoints", inherit=False) == "--set widgets.options (command line)"
    assert loaded.source_of("widgets.options.prefix", inherit=False) == "default"


def test_source_of_list_items_and_enclosing_keys(job_file) -> None:
    file = job_file('[widgets]\nname = "x"\ntags = ["a"]\n')
    loaded = load(file, environ={"RALLYPOINT_GADGETS_OPTIONS_ENDPOINTS": '["a", "b"]'})

    assert loaded.source_of("widgets.tags[0]") == "job.toml"
    assert loaded.source_of("gadgets.options.endpoints[1]") == "RALLYPOINT_GADGETS_OPTIONS_ENDPOINTS (environment)"
    assert loaded.source_of("widgets.env") == "job.toml"  # errors are located in the enclosing table
    assert loaded.source_of("widgets.env", inherit=False) == "default"  # but the value is a default


# ---------------------------------------------------------------------------------------------
# Errors, with their exact messages


def test_bad_duration_message_is_exact(job_file) -> None:
    error = load_error(job_file('[widgets]\njoin_timeout = "ten minutes"\n'), environ={})

    assert str(error) == 'job.toml: widgets.join_timeout: invalid duration \'ten minutes\' (write e.g. "10m" or "30s")'
    [issue] = error.issues
    assert (issue.source, issue.key) == ("job.toml", "widgets.join_timeout")


WIDGET_KEYS = "backend, env, grace, join_timeout, max, min, name, options, tags"


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            "[widgets]\nmni = 2\n",
            f"job.toml: widgets.mni: unknown key 'mni' in [widgets]; did you mean 'min'? (known keys: {WIDGET_KEYS})",
        ),
        (
            '[widgets]\njoin_timout = "5m"\n',
            "job.toml: widgets.join_timout: unknown key 'join_timout' in [widgets]; did you mean 'join_timeout'? "
            f"(known keys: {WIDGET_KEYS})",
        ),
        (
            "[inspection]\ncolour = true\n",
            "job.toml: inspection.colour: unknown key 'colour' in [inspection] (known keys: inspector, options, "
            "verbose)",
        ),
        ('[widgets]\nmax = "four"\n', "job.toml: widgets.max: expected an integer, got 'four'"),
        ("[widgets]\nmin = 2.5\n", "job.toml: widgets.min: expected an integer, got 2.5"),
        ("[widgets]\nname = 3\n", "job.toml: widgets.name: expected a string, got 3"),
        ('[widgets]\ntags = "--epochs 3"\n', "job.toml: widgets.tags: expected a list, got '--epochs 3'"),
        ('[widgets]\ntags = ["a", 3]\n', "job.toml: widgets.tags[1]: expected a string, got 3"),
        ("[inspection]\nverbose = 3\n", "job.toml: inspection.verbose: expected true or false, got 3"),
        ("widgets = 3\n", "job.toml: widgets: expected a table, got 3"),
        ("[widgets]\noptions = [1]\n", "job.toml: widgets.options: expected a table, got a list"),
        ("[widgets]\nmin = 0\n", "job.toml: widgets.min: must be at least 1, got 0"),
        ('[gadgets]\ntimeout = "0s"\n', "job.toml: gadgets.timeout: must be greater than 0, got '0s'"),
        (
            "[widgets]\ngrace = -3\n",
            'job.toml: widgets.grace: invalid duration -3: must be a finite, non-negative time (write e.g. "10m" or '
            '"30s")',
        ),
        ('[delivery]\nmode = "slow"\n', "job.toml: delivery.mode: expected 'safe' or 'fast', got 'slow'"),
        ("[widgets]\nmin = 3\nmax = 2\n", "job.toml: widgets: max (2) is smaller than min (3)"),
    ],
)
def test_structure_errors(job_file, toml: str, message: str) -> None:
    assert str(load_error(job_file(toml), environ={})) == message


@pytest.mark.parametrize(
    ("toml", "name", "guess"),
    [
        ("[widget]\nmin = 2\n", "widget", "widgets"),
        ("[nodes]\nmax = 2\n", "nodes", None),
        ('name = "x"\n', "name", None),
    ],
)
def test_unknown_section_names_the_known_ones_and_hints_at_a_missing_package(
    job_file, toml: str, name: str, guess: str | None
) -> None:
    error = load_error(job_file(toml), environ={})

    hint = f"; did you mean [{guess}]?" if guess else ""
    assert str(error) == (
        f"job.toml: {name}: unknown section [{name}]{hint} (known sections: delivery, gadgets, inspection, "
        f"widgets). {MISSING_PACKAGE.format(name=name)}"
    )


def test_every_problem_is_reported_not_only_the_first(job_file) -> None:
    error = load_error(job_file('[widgets]\nmax = "four"\nmni = 2\n[inspection]\ninspectr = "loupe"\n'), environ={})

    assert [(i.source, i.key) for i in error.issues] == [
        ("job.toml", "widgets.max"),
        ("job.toml", "widgets.mni"),
        ("job.toml", "inspection.inspectr"),
    ]
    assert str(error).count("\n") == 2


def test_errors_name_the_env_var_that_set_the_value(job_file) -> None:
    file = job_file('[widgets]\nname = "x"\nmin = 1\n')
    environ = {"RALLYPOINT_WIDGETS_MAX": "lots", "RALLYPOINT_WIDGETS_TAGS": '["a", 3]', "RALLYPOINT_WIDGETS_MAXX": "3"}

    error = load_error(file, environ=environ)

    assert [str(i) for i in error.issues] == [
        "RALLYPOINT_WIDGETS_MAX (environment): widgets.max: expected an integer, got 'lots'",
        "RALLYPOINT_WIDGETS_TAGS (environment): widgets.tags[1]: expected a string, got 3",
        "RALLYPOINT_WIDGETS_MAXX (environment): widgets.maxx: unknown key 'maxx' in [widgets]; did you mean 'max'? "
        f"(known keys: {WIDGET_KEYS})",
    ]


def test_errors_name_the_cli_flag_that_set_the_value(job_file) -> None:
    overrides = [("widgets.grace", "soon", "--set widgets.grace (command line)")]

    error = load_error(job_file(LAYERED), environ={}, overrides=overrides)

    assert str(error) == (
        '--set widgets.grace (command line): widgets.grace: invalid duration \'soon\' (write e.g. "10m" or "30s")'
    )


def test_invalid_toml(job_file) -> None:
    error = load_error(job_file("[widgets\nmin = 1\n"), environ={})

    assert str(error) == "job.toml: invalid TOML: Expected ']' at the end of a table declaration (at line 1, column 9)"


def test_duplicate_key_is_invalid_toml(job_file) -> None:
    error = load_error(job_file("[widgets]\nmin = 1\nmin = 2\n"), environ={})

    assert str(error).startswith("job.toml: invalid TOML: ")


def test_missing_file(job_file) -> None:
    job_file("")  # chdir into tmp_path

    assert str(load_error("missing.toml", environ={})) == "missing.toml: no such file; check the path"


def test_directory_instead_of_file(tmp_path: Path, job_file) -> None:
    job_file("")
    (tmp_path / "jobs").mkdir()

    assert str(load_error("jobs", environ={})) == "jobs: is a directory; give the path of a .toml job file"


def test_file_that_is_not_utf8(tmp_path: Path, job_file) -> None:
    job_file("")
    (tmp_path / "latin1.toml").write_bytes('[widgets]\nname = "caf\xe9"\n'.encode("latin-1"))

    assert str(load_error("latin1.toml", environ={})) == "latin1.toml: is not UTF-8 text; a job file is TOML"


def test_absolute_path_is_named_as_given(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text("[widgets]\nmin = -1\n")

    assert str(load_error(str(path), environ={})) == f"{path}: widgets.min: must be at least 1, got -1"


def test_values_are_not_coerced_from_strings(job_file) -> None:
    path = job_file(
        """
        [widgets]
        max = "4"

        [inspection]
        verbose = "yes"
        """
    )
    with pytest.raises(ConfigError) as info:
        load(path, environ={})
    assert [str(i) for i in info.value.issues] == [
        "job.toml: widgets.max: expected an integer, got '4'",
        "job.toml: inspection.verbose: expected true or false, got 'yes'",
    ]
