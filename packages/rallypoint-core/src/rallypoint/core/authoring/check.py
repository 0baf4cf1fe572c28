"""``rallypoint plugin check DIST``: what one distribution's plugin registers, and whether it fits.

The check loads the distribution's entry points (groups ``rallypoint`` and
``rallypoint.essential``) next to the essential packages only, so that another broken plugin
cannot hide or cause a problem, and reports:

* hook implementations whose name no specification declares (with the closest real hook), or
  whose arguments are not among the specification's;
* records that are not of their kind's record class, factories or availability checks that do
  not import, options models that are not pydantic models, reject an empty table, or accept
  unknown keys (a misspelt key in the job file would then be silently ignored);
* heavy imports: importing the hook module, or building the plugin manager with it and asking
  every registry for its records, must not import ``torch``, ``grpc`` or ``etcd`` (checked in a
  fresh interpreter, since this one may have imported them already).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import json
import subprocess
import sys
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from rallypoint.core.errors import EXIT_USAGE, RallypointError

__all__ = ["HEAVY_MODULES", "CheckReport", "DistributionNotFound", "check_distribution"]

#: Top-level modules a hook module must not import (directly or by registering its records).
HEAVY_MODULES = ("torch", "grpc", "etcd", "etcd3")
_GROUPS = ("rallypoint", "rallypoint.essential")

#: Run in a fresh interpreter: import the module, then build a manager with it and read every registry.
_PROBE = """
import importlib, json, sys
heavy = set(json.loads(sys.argv[3]))
def loaded():
    return sorted(heavy & {name.split(".")[0] for name in sys.modules})
module = importlib.import_module(sys.argv[2])
after_import = loaded()
from rallypoint.core.plugins import get_plugin_manager
pm = get_plugin_manager(autoload=False)
if pm.get_plugin(sys.argv[1]) is None:  # essential packages are registered already
    pm.register(module, name=sys.argv[1])
for kind in pm.kinds():
    pm.registry(kind)
print(json.dumps({"import": after_import, "registration": loaded()}))
"""


class DistributionNotFound(RallypointError):
    """No installed distribution has that name, or it has no rallypoint entry point (exit code 2)."""

    exit_code = EXIT_USAGE


@dataclass
class CheckReport:
    """What :func:`check_distribution` found.

    Attributes:
        distribution: the distribution's name as installed.
        version: its version.
        plugins: ``(entry-point name, module)`` of each plugin it installs.
        registers: one line per record: ``"<kind label>: <name> ..."``.
        hooks: the hooks it implements, by plugin.
        problems: what is wrong, one sentence each; empty when the plugin fits.
        notes: what is worth knowing but may be intended (options without defaults).
    """

    distribution: str
    version: str
    plugins: list[tuple[str, str]] = field(default_factory=list)
    registers: list[str] = field(default_factory=list)
    hooks: dict[str, list[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether no problem was found."""
        return not self.problems


def _entry_points(name: str) -> tuple[importlib.metadata.Distribution, list[importlib.metadata.EntryPoint]]:
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise DistributionNotFound(
            f"no installed distribution is called {name!r}; install it first (pip install -e DIR), "
            "and give its name as in pyproject.toml (e.g. rallypoint-fast-ring)"
        ) from None
    found = [ep for ep in dist.entry_points if ep.group in _GROUPS]
    if not found:
        raise DistributionNotFound(
            f"{dist.metadata['Name']} has no rallypoint entry point: add one to its pyproject.toml, "
            '[project.entry-points.rallypoint] NAME = "package.hooks", and reinstall it'
        )
    return dist, found


def _probe_imports(plugin: str, module: str) -> list[str]:
    """Heavy modules loaded by importing ``module`` and by registering it (in a fresh interpreter)."""
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, plugin, module, json.dumps(HEAVY_MODULES)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return [f"{module}: the import check could not run it in a fresh interpreter: {tail}"]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    problems = []
    if found["import"]:
        problems.append(
            f"importing {module} imports {', '.join(found['import'])}: import them inside the functions "
            "that need them (the agent and the CLI load every hook module)"
        )
    late = sorted(set(found["registration"]) - set(found["import"]))
    if late:
        problems.append(
            f"registering {plugin} imports {', '.join(late)}: registration hooks must return records that "
            "name heavy code by import path ('package.module:object'), not import it"
        )
    return problems


def _hook_impls(module: ModuleType) -> dict[str, Any]:
    marker = "rallypoint_impl"  # what rallypoint.core.plugins.hookimpl sets on a function
    return {name: obj for name, obj in vars(module).items() if callable(obj) and hasattr(obj, marker)}


def _check_hooks(pm: Any, plugin: str, module: ModuleType) -> tuple[list[str], list[str]]:
    """The hooks ``module`` implements, and problems with their names and arguments."""
    from rallypoint.core.errors import did_you_mean

    known = [name for name in vars(pm.hook) if not name.startswith("_") and getattr(pm.hook, name).has_spec()]
    problems, names = [], []
    for name, function in sorted(_hook_impls(module).items()):
        names.append(name)
        caller = getattr(pm.hook, name, None)
        if caller is None or not caller.has_spec():
            guess = did_you_mean(name, known)
            hint = f"; did you mean {guess!r}?" if guess else f" (known: {', '.join(sorted(known))})"
            problems.append(f"{plugin}: {name} is not a hook any installed package declares{hint}")
            continue
        spec_args = set(caller.spec.argnames)
        args = [p for p in inspect.signature(function).parameters if p != "self"]
        extra = [a for a in args if a not in spec_args]
        if extra:
            problems.append(
                f"{plugin}: {name}({', '.join(args)}) takes {', '.join(extra)}, which its specification does not "
                f"pass; it may take any of: {', '.join(caller.spec.argnames) or 'no arguments'}"
            )
    return names, problems


def _check_options_model(where: str, model: Any, notes: list[str]) -> list[str]:
    from pydantic import BaseModel, ValidationError

    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return [f"{where}: options_model {model!r} is not a pydantic model class"]
    problems: list[str] = []
    if model.model_config.get("extra") != "forbid":
        problems.append(
            f"{where}: {model.__name__} accepts unknown keys, so a misspelt option is silently ignored; "
            'set model_config = ConfigDict(extra="forbid")'
        )
    try:
        model.model_validate({})
    except ValidationError as exc:
        required = ", ".join(str(e["loc"][0]) for e in exc.errors() if e["type"] == "missing")
        notes.append(
            f"{where}: {model.__name__} has no default for {required or 'some fields'}: a job that selects it "
            "must set them in its options table"
        )
    return problems


def _check_records(pm: Any, plugin: str, report: CheckReport) -> None:
    """Every record ``plugin`` registers: its class, import paths and options model."""
    from rallypoint.core.records import load_object

    for kind in pm.kinds():
        try:
            entries = [e for e in pm.registry(kind).entries() if e.provider.name == plugin]
        except RallypointError as exc:
            report.problems.append(f"{plugin}: {kind.label}: {exc}")
            continue
        for entry in entries:
            record = entry.record
            where = f"{kind.label} {record.name!r}"
            model = getattr(record, "options_model", None)
            line = f"{kind.label}: {record.name}"
            if model is not None:
                line += f" (options: {model.__module__}.{model.__name__})"
            report.registers.append(line + (f" - {record.summary}" if record.summary else ""))
            if not isinstance(record, kind.record_class):
                report.problems.append(f"{where} is a {type(record).__name__}, not a {kind.record_class.__name__}")
                continue
            for attribute in ("factory", "command", "availability"):
                path = getattr(record, attribute, None)
                if isinstance(path, str) and path:
                    try:
                        load_object(path)
                    except RallypointError as exc:
                        report.problems.append(f"{where}: {attribute}: {exc}")
            if model is not None:
                report.problems.extend(_check_options_model(where, model, report.notes))


def check_distribution(name: str) -> CheckReport:
    """Check the plugin(s) distribution ``name`` installs (see the module's description).

    Raises:
        DistributionNotFound: ``name`` is not installed, or installs no rallypoint entry point.
    """
    import pluggy

    from rallypoint.core.plugins import PluginInfo, get_plugin_manager

    dist, entry_points = _entry_points(name)
    report = CheckReport(dist.metadata["Name"], dist.version)
    pm = get_plugin_manager(autoload=False)
    for ep in entry_points:
        report.plugins.append((ep.name, ep.value))
        try:
            module = ep.load()
        except Exception as exc:  # noqa: BLE001 - any import failure is the finding
            report.problems.append(f"{ep.name}: importing {ep.value} fails: {type(exc).__name__}: {exc}")
            continue
        report.problems.extend(_probe_imports(ep.name, ep.value))
        registered = True
        if ep.group == "rallypoint":  # essential ones are registered already
            try:
                pm.register_plugin(module, PluginInfo(ep.name, report.distribution, report.version))
            except (pluggy.PluginValidationError, ValueError) as exc:
                report.problems.append(f"{ep.name}: {exc}")
                registered = False
        names, problems = _check_hooks(pm, ep.name, module)
        report.hooks[ep.name] = names
        report.problems.extend(problems)
        if registered:
            _check_records(pm, ep.name, report)
    return report
