"""``rallypoint plugin new`` and ``rallypoint plugin check``, with core alone (plus the test fakes).

Core declares no kind of plugin to write: the made-up ``acme-widgets`` declares ``widget-backend``
(``rallypoint_plugin_templates``) and ships its templates, as every subsystem does. What the
generated plugins of the real kinds do once installed (their tests, a job selecting them) is
checked in a fresh virtual environment by the meta-package's tests
(``packages/rallypoint/tests/test_authoring_install.py``) and which package declares each kind by
``integration-tests/test_plugin_kinds.py``; here: what is written, and what the checker finds in
distributions made to be wrong.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from rallypoint.core.authoring.check import _check_options_model
from rallypoint.core.authoring.generate import TemplateError, generate_plugin
from rallypoint.core.authoring.kinds import TemplateKind, installed_kinds
from rallypoint.core.cli import main
from rallypoint.core.plugins import get_plugin_manager

PLACEHOLDER = re.compile(
    r"__(NAME|DIST|MODULE|CLASS|ENVVAR|KIND|SUMMARY|HOOK|IMPL|DEPENDENCIES|TESTING|EXPECTED|KIT_NOTE|SELECTS_NOTE)__"
)


def test_the_kinds_are_those_the_installed_packages_declare() -> None:
    (kind,) = installed_kinds(get_plugin_manager())
    assert kind.name == "widget-backend"
    assert kind.package == "acme_widget_templates"


def test_plugin_new_writes_a_complete_distribution(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kind = "widget-backend"
    assert main(["plugin", "new", kind, "fast-ring", "--dir", str(tmp_path)]) == 0

    root = tmp_path / "rallypoint-fast-ring"
    assert capsys.readouterr().out.startswith(f"wrote rallypoint-fast-ring ({kind}) in {root}:\n")
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert project["name"] == "rallypoint-fast-ring"
    assert project["entry-points"]["rallypoint"] == {"fast-ring": "rallypoint_fast_ring.hooks"}
    assert {"pytest>=8", "pytest-xdist>=3.5"} <= set(project["optional-dependencies"]["testing"])
    assert all(r.endswith(">=0.1,<0.2") for r in project["dependencies"] if r.startswith("rallypoint"))
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert {
        "README.md",
        "pyproject.toml",
        "src/rallypoint_fast_ring/hooks.py",
        "src/rallypoint_fast_ring/py.typed",
    } <= set(files)
    assert any(f.startswith("tests/test_") and f.endswith("_plugin.py") for f in files)
    for name in files:
        text = (root / name).read_text()
        assert not PLACEHOLDER.search(text), f"{name}: {PLACEHOLDER.search(text)}"
        assert "__module__" not in name
        if name.endswith(".py"):
            compile(text, name, "exec")  # valid Python


def test_the_declared_dependencies_and_example_reach_the_distribution(tmp_path: Path) -> None:
    assert main(["plugin", "new", "widget-backend", "k", "--dir", str(tmp_path)]) == 0
    root = tmp_path / "rallypoint-k"
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert project["dependencies"] == ["acme-widgets>=0.1,<0.2"]
    assert project["optional-dependencies"]["testing"][0] == "acme-widgets>=0.1,<0.2"
    assert '["0=k", "1=k"]' in (root / "tests" / "test_rallypoint_k_job.py").read_text()
    assert "from acme_widgets import" in (root / "tests" / "test_rallypoint_k_plugin.py").read_text()
    assert "`widgets.backend`" in (root / "README.md").read_text()


def test_a_kind_whose_templates_are_missing_is_a_clear_error(tmp_path: Path) -> None:
    gone = TemplateKind(
        name="gone", summary="s", hook="rallypoint_widget_backends", requires=(), testing=(),
        templates="acme_widget_templates:nowhere", impl="backend",
    )  # fmt: skip
    with pytest.raises(TemplateError, match=r"KIND: gone: no template directory 'acme_widget_templates:nowhere'"):
        generate_plugin("gone", "x", tmp_path, kinds=(gone,))
    assert list(tmp_path.iterdir()) == []


def test_two_packages_declaring_one_kind_differently_is_an_error() -> None:
    from rallypoint.core.plugins import get_plugin_manager, hookimpl

    class Rival:
        @hookimpl
        def rallypoint_plugin_templates(self) -> list[TemplateKind]:
            return [
                TemplateKind(
                    name="widget-backend", summary="another", hook="rallypoint_widget_backends",
                    requires=(), testing=(), templates="rival:widget-backend", impl="backend",
                )
            ]  # fmt: skip

    with pytest.raises(ValueError, match="two installed packages declare the plugin kind 'widget-backend'"):
        installed_kinds(get_plugin_manager(plugins=[Rival()]))


def test_plugin_new_refuses_a_bad_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugin", "new", "widget-backend", "Fast_Ring", "--dir", str(tmp_path)]) == 2

    assert capsys.readouterr().err == (
        "error: NAME: 'Fast_Ring' is not a plugin name: use lower-case letters and digits, words joined by '-' "
        "(e.g. 'fast-ring'); the distribution becomes rallypoint-NAME\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_plugin_new_refuses_an_unknown_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugin", "new", "widget", "x"]) == 2

    err = capsys.readouterr().err
    assert "Invalid value for '{widget-backend}': 'widget' is not 'widget-backend'" in err


def test_plugin_new_does_not_overwrite_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugin", "new", "widget-backend", "x", "--dir", str(tmp_path)]) == 0
    readme = tmp_path / "rallypoint-x" / "README.md"
    readme.write_text("mine")

    assert main(["plugin", "new", "widget-backend", "x", "--dir", str(tmp_path)]) == 2
    assert f"error: {tmp_path / 'rallypoint-x'} already exists; choose another --dir or NAME" in capsys.readouterr().err
    assert readme.read_text() == "mine"
    assert main(["plugin", "new", "widget-backend", "x", "--dir", str(tmp_path), "--force"]) == 0
    assert readme.read_text().startswith("# rallypoint-x")


BROKEN = """
from rallypoint.core.plugins import hookimpl
from rallypoint.core.records import CliCommand
import torch  # heavy, at import


@hookimpl
def rallypoint_cli_command():  # singular: no such hook
    return []


@hookimpl
def rallypoint_cli_commands():
    return [CliCommand(name="broken", summary="nothing", command="nowhere_at_all:cmd")]
"""

EXTRA_ARGUMENT = """
from rallypoint.core.plugins import hookimpl


@hookimpl
def rallypoint_cli_commands(verbose):
    return []
"""


def test_plugin_check_reports_what_is_wrong(run_cli, make_distribution, tmp_path: Path) -> None:
    site = tmp_path / "site"
    module = make_distribution(site, dist="rallypoint-broken", entry_point="broken", source=BROKEN)
    (site / "torch.py").write_text("")  # a stand-in: the check looks for the module name only

    result = run_cli("plugin", "check", "rallypoint-broken", env={"PYTHONPATH": str(site)})

    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines()[:3] == [
        "rallypoint-broken 1.0",
        f"  plugin broken ({module}): hooks rallypoint_cli_command, rallypoint_cli_commands",
        "  CLI command: broken - nothing",
    ]
    problems = result.stderr.splitlines()
    assert problems == [
        f"problem: importing {module} imports torch: import them inside the functions that need them "
        "(the agent and the CLI load every hook module)",
        "problem: broken: rallypoint_cli_command is not a hook any installed package declares; "
        "did you mean 'rallypoint_cli_commands'?",
        "problem: CLI command 'broken': command: cannot import 'nowhere_at_all' (for 'nowhere_at_all:cmd'): "
        "No module named 'nowhere_at_all'",
    ]


def test_plugin_check_reports_an_argument_the_spec_does_not_pass(run_cli, make_distribution, tmp_path: Path) -> None:
    site = tmp_path / "site"
    make_distribution(site, dist="rallypoint-chatty", entry_point="chatty", source=EXTRA_ARGUMENT)

    result = run_cli("plugin", "check", "rallypoint-chatty", env={"PYTHONPATH": str(site)})

    assert result.returncode == 1
    assert (
        "problem: chatty: rallypoint_cli_commands(verbose) takes verbose, which its specification does not pass; "
        "it may take any of: no arguments"
    ) in result.stderr.splitlines()


FITS = """
from rallypoint.core.plugins import hookimpl
from rallypoint.core.records import CliCommand


@hookimpl
def rallypoint_cli_commands():
    return [CliCommand(name="listing", summary="the plugins, again", command="rallypoint.core.commands:plugins")]
"""


def test_plugin_check_of_a_plugin_that_fits(run_cli, make_distribution, tmp_path: Path) -> None:
    module = make_distribution(tmp_path / "site", dist="rallypoint-fits", entry_point="fits", source=FITS)

    result = run_cli("plugin", "check", "rallypoint-fits", env={"PYTHONPATH": str(tmp_path / "site")})

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "rallypoint-fits 1.0",
        f"  plugin fits ({module}): hooks rallypoint_cli_commands",
        "  CLI command: listing - the plugins, again",
        "ok: the hooks fit their specifications, and the hook modules import nothing heavy",
    ]
    assert result.stderr == ""


def test_plugin_check_of_something_not_installed(run_cli) -> None:
    result = run_cli("plugin", "check", "rallypoint-nowhere")

    assert result.returncode == 2
    assert result.stderr.startswith("error: no installed distribution is called 'rallypoint-nowhere'; install it first")


def test_options_models_that_accept_unknown_keys_or_need_values_are_reported() -> None:
    from pydantic import BaseModel, ConfigDict

    class Loose(BaseModel):
        size: int = 1

    class Strict(BaseModel):
        model_config = ConfigDict(extra="forbid")
        url: str

    notes: list[str] = []
    assert _check_options_model("widget backend 'x'", Loose, notes) == [
        "widget backend 'x': Loose accepts unknown keys, so a misspelt option is silently ignored; "
        'set model_config = ConfigDict(extra="forbid")'
    ]
    assert _check_options_model("widget backend 'y'", Strict, notes) == []
    assert notes == [
        "widget backend 'y': Strict has no default for url: a job that selects it must set them in its options table"
    ]
    assert _check_options_model("widget backend 'z'", dict, notes) == [
        "widget backend 'z': options_model <class 'dict'> is not a pydantic model class"
    ]


def test_each_command_line_sees_the_kinds_installed_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The KIND choice is not cached in the process (tests, embedding programs run it many times)."""
    from rallypoint.core.authoring import generate as generate_module
    from rallypoint.core.authoring import kinds as kinds_module

    assert main(["plugin", "new", "widget-backend", "one", "--dir", str(tmp_path)]) == 0
    (widget,) = installed_kinds(get_plugin_manager())
    renamed = TemplateKind(**{**widget.__dict__, "name": "gizmo-backend"})
    for module in (kinds_module, generate_module):
        monkeypatch.setattr(module, "installed_kinds", lambda pm=None: (renamed,))
    capsys.readouterr()
    assert main(["plugin", "new", "gizmo-backend", "two", "--dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("wrote rallypoint-two (gizmo-backend)")
    assert main(["plugin", "new", "widget-backend", "three", "--dir", str(tmp_path)]) == 2
