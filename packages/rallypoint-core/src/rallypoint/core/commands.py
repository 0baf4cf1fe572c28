"""``rallypoint plugins`` and ``rallypoint config``."""

from __future__ import annotations

import json
from typing import Any

import click

from rallypoint.core.cli import plugin_manager
from rallypoint.core.errors import ConfigError, ConfigIssue

__all__ = ["config", "plugins"]


def _kinds_in_table_order(pm: Any) -> list[Any]:
    """Kinds selected in the job file first, then the others (CLI commands), each in declaration order."""
    kinds = list(pm.kinds())
    return [k for k in kinds if k.config_key] + [k for k in kinds if not k.config_key]


def plugin_table(pm: Any, conflicts: list[str] | None = None) -> list[dict[str, Any]]:
    """Every registered plugin with its distribution, version, registrations and declarations.

    Each row has ``registers`` (kind label to record names) and ``declares`` (the plugin kinds
    and job-file sections the plugin declares). A kind whose registrations conflict (one name
    registered twice) is left out of the table and its error appended to ``conflicts``, so the
    rest of the listing is still shown.
    """
    from rallypoint.core.errors import PluginConflictError

    rows: dict[str, dict[str, Any]] = {}
    for name, info in pm.infos.items():
        if pm.get_plugin(name) is None:
            continue
        rows[name] = {
            "name": name,
            "distribution": info.distribution,
            "version": info.version,
            "essential": info.essential,
            "registers": {},
            "declares": {"kinds": [], "sections": []},
        }
    kinds = _kinds_in_table_order(pm)
    for kind in kinds:
        owner = rows.get(pm.declared_by.get(f"plugin kind {kind.hook}", ""))
        if owner is not None:
            owner["declares"]["kinds"].append(kind.label)
    for section in pm.sections():
        owner = rows.get(pm.declared_by.get(f"config section {section.name}", ""))
        if owner is not None:
            owner["declares"]["sections"].append(section.name)
    for kind in kinds:
        try:
            registry = pm.registry(kind)
        except PluginConflictError as exc:
            if conflicts is None:
                raise
            conflicts.append(str(exc))
            continue
        for entry in registry.entries():
            row = rows.get(entry.provider.name)
            if row is not None:
                row["registers"].setdefault(kind.label, []).append(entry.record.name)
    return list(rows.values())


def _row_lines(row: dict[str, Any]) -> list[str]:
    lines = [f"{kind}: {', '.join(names)}" for kind, names in row["registers"].items()]
    declares = row["declares"]
    if declares["kinds"]:
        lines.append(f"declares kinds: {', '.join(declares['kinds'])}")
    if declares["sections"]:
        lines.append(f"declares sections: {', '.join(f'[{name}]' for name in declares['sections'])}")
    return lines or ["nothing yet"]


@click.group()
def plugins() -> None:
    """Inspect installed plugins."""


@plugins.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def plugins_list(as_json: bool) -> int:
    """List every plugin: its distribution and version, and what it registers of each kind.

    Essential packages (marked *, loaded even with RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD) also show
    the plugin kinds and job-file sections they declare. Plugins that failed to load are listed
    last with the reason. Exits 2 when two plugins register the same name (the listing is still
    printed, with the conflict).
    """
    pm = plugin_manager()
    conflicts: list[str] = []
    rows = plugin_table(pm, conflicts)
    failures = [
        {"name": f.info.name, "distribution": f.info.distribution, "version": f.info.version, "error": str(f.error)}
        for f in pm.load_failures
    ]
    if as_json:
        data = {"plugins": rows, "failed": failures, "conflicts": conflicts, "disabled": sorted(pm.disabled)}
        click.echo(json.dumps(data, indent=2))
        return 2 if conflicts else 0
    width_name = max([len("PLUGIN"), *(len(r["name"]) + 2 for r in rows)])
    dists = [f"{r['distribution'] or '-'} {r['version'] or ''}".strip() for r in rows]
    width_dist = max([len("DISTRIBUTION"), *(len(d) for d in dists)])
    click.echo(f"{'PLUGIN':<{width_name}}  {'DISTRIBUTION':<{width_dist}}  REGISTERS")
    for row, dist in zip(rows, dists, strict=True):
        lines = _row_lines(row)
        label = row["name"] + (" *" if row["essential"] else "")
        click.echo(f"{label:<{width_name}}  {dist:<{width_dist}}  {lines[0]}")
        for more in lines[1:]:
            click.echo(f"{'':<{width_name}}  {'':<{width_dist}}  {more}")
    click.echo("\n* essential package (loaded even when RALLYPOINT_DISABLE_PLUGIN_AUTOLOAD is set)")
    if failures:
        click.echo("\nfailed to load:")
        for failure in failures:
            click.echo(f"  {failure['error']}")
    disabled = sorted(pm.disabled)
    if disabled:
        click.echo(f"\ndisabled by RALLYPOINT_DISABLE_PLUGINS: {', '.join(disabled)}")
    if conflicts:
        click.echo("\nconflicts (these registrations cannot be used until resolved):", err=True)
        for conflict in conflicts:
            click.echo(f"  {conflict}", err=True)
        return 2
    return 0


@click.group()
def config() -> None:
    """Work with job files."""


def _parse_set(values: tuple[str, ...]) -> list[tuple[str, Any, str]]:
    from rallypoint.core.config import parse_value

    out = []
    issues = []
    for item in values:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            issues.append(ConfigIssue("--set (command line)", item, "write it as KEY=VALUE, e.g. section.key=4"))
            continue
        if any(not part.strip() for part in key.split(".")):
            message = "a key path has no empty parts: write it as section.key, e.g. nodes.min=2"
            issues.append(ConfigIssue(f"--set {key} (command line)", key, message))
            continue
        label = f"--set {key} (command line)"
        try:
            out.append((key, parse_value(text), label))
        except ValueError as exc:
            issues.append(ConfigIssue(label, key, str(exc)))
    if issues:
        raise ConfigError(issues)
    return out


@config.command("check")
@click.argument("job_file", type=click.Path(dir_okay=False, path_type=str))
@click.option(
    "--set",
    "-s",
    "set_values",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a key, e.g. --set section.key=value (repeatable).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the resolved configuration as JSON.")
def config_check(job_file: str, set_values: tuple[str, ...], as_json: bool) -> int:
    """Validate JOB_FILE and print the resolved configuration.

    Both phases run: the file's structure (the sections installed packages declare), then every
    plugin it selects is looked up and its options table validated. Each value is shown with
    where it was set: the file, a RALLYPOINT_* variable, a --set flag, or the default. Exits 2
    with every problem listed when the job is invalid.
    """
    from rallypoint.core.config import load_job_config, render_resolved, resolve_config
    from rallypoint.core.config.render import resolved_as_dict

    pm = plugin_manager()
    loaded = load_job_config(job_file, pm, overrides=_parse_set(set_values))
    resolved = resolve_config(loaded, pm)
    if as_json:
        click.echo(json.dumps(resolved_as_dict(resolved), indent=2))
    else:
        click.echo(render_resolved(resolved), nl=False)
        click.echo(f"\n{job_file}: ok", err=True)
    return 0


@config.command("show")
@click.argument("job_file", required=False, type=click.Path(dir_okay=False, path_type=str))
@click.option("--set", "-s", "set_values", multiple=True, metavar="KEY=VALUE", help="Override a key (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print {config, sources, plugins} as JSON.")
def config_show(job_file: str | None, set_values: tuple[str, ...], as_json: bool) -> int:
    """Show the resolved job (JOB_FILE, RALLYPOINT_* variables, --set) with the source of every value.

    Without JOB_FILE, the defaults and the RALLYPOINT_* variables are shown. Each value is
    followed by where it was set: the file, a variable, a flag, the environment the command runs
    in (inside a Slurm allocation: "slurm (SLURM_JOB_NUM_NODES)"), or the default. `rallypoint
    run --dry-run` shows the same for a torchrun-style command line, and the plan.
    """
    from rallypoint.core.config import load_in_environment, render_resolved, resolve_config
    from rallypoint.core.config.render import resolved_as_dict, resolved_sources

    pm = plugin_manager()
    resolved = resolve_config(load_in_environment(job_file, pm, overrides=_parse_set(set_values)), pm)
    if as_json:
        data = resolved_as_dict(resolved)
        plugins = data.pop("plugins")
        click.echo(json.dumps({"config": data, "sources": resolved_sources(resolved), "plugins": plugins}, indent=2))
    else:
        click.echo(render_resolved(resolved), nl=False)
    return 0


@config.command("schema")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=str), help="Write to a file instead.")
def config_schema(output: str | None) -> int:
    """Print the JSON Schema of a job file, plugin options included (for editors).

    Every section the installed packages declare, and for each plugin selector (such as
    rendezvous.backend) the options of each installed plugin, chosen by the selector's value.
    """
    from rallypoint.core.json_schema import job_json_schema

    text = json.dumps(job_json_schema(plugin_manager()), indent=2)
    if output:
        with open(output, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    else:
        click.echo(text)
    return 0
