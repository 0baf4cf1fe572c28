"""``rallypoint config show`` (every value with its source) and ``rallypoint config schema`` (JSON Schema)."""

from __future__ import annotations

import json

from rallypoint.core.cli import main


def test_config_show_gives_the_source_of_every_value(job_file, capsys, monkeypatch) -> None:
    monkeypatch.setenv("RALLYPOINT_WIDGETS_MIN", "7")
    path = job_file('[widgets]\nbackend = "cog"\n[widgets.options]\nendpoints = ["a:1"]\n')

    assert main(["config", "show", path, "--set", "gadgets.maker=lathe", "--json"]) == 0

    data = json.loads(capsys.readouterr().out)
    sources = data["sources"]
    assert sources["widgets.backend"] == "job.toml"
    assert sources["widgets.min"] == "RALLYPOINT_WIDGETS_MIN (environment)"
    assert sources["gadgets.maker"] == "--set gadgets.maker (command line)"
    assert sources["widgets.options.endpoints"] == "job.toml"
    assert sources["widgets.options.retries"] == "default"  # an option of the selected plugin, defaulted
    assert data["config"]["widgets"]["min"] == 7
    assert set(sources) >= {f"widgets.{key}" for key in data["config"]["widgets"] if key != "options"}


def test_config_show_without_a_job_file_shows_the_defaults(capsys) -> None:
    assert main(["config", "show"]) == 0
    out = capsys.readouterr().out
    assert "[widgets]\n" in out
    assert 'backend = "plain"  # default' in out


def test_config_schema_holds_every_section_and_each_plugins_options(capsys, tmp_path) -> None:
    assert main(["config", "schema", "-o", str(tmp_path / "schema.json")]) == 0
    schema = json.loads((tmp_path / "schema.json").read_text())

    assert schema["$schema"].endswith("2020-12/schema")
    assert schema["additionalProperties"] is False
    assert {"widgets", "gadgets", "inspection", "delivery"} <= set(schema["properties"])
    widgets = schema["properties"]["widgets"]
    assert "cog" in widgets["properties"]["backend"]["examples"]
    (branch,) = [b for b in widgets["allOf"] if "cog" in json.dumps(b["if"])]
    chosen = branch["if"]["anyOf"][0] if "anyOf" in branch["if"] else branch["if"]
    assert chosen["properties"]["backend"]["enum"] == ["cog", "cg"]
    assert "endpoints" in branch["then"]["properties"]["options"]["properties"]
