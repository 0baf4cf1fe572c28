"""The documentation rules of hook specifications, as a check a test runs over every installed spec.

Every hook specification has an example in its docstring. Every argument of a lifecycle or
decision hook (any hook that takes arguments, except core's ``rallypoint_addhooks``, which hands
over pluggy's manager) is annotated with a typed record: a documented class exported by the
package that declares the hook (``acme_widgets`` for ``acme_widgets.hookspecs``), never
``Any``; and the docstring's ``Args:`` section describes it.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["MECHANISM_HOOKS", "check_hookspec", "installed_hookspecs"]

#: Hooks of the plugin mechanism itself, whose arguments are not records.
MECHANISM_HOOKS = frozenset({"rallypoint_addhooks"})


def _annotation_name(annotation: Any) -> str:
    if isinstance(annotation, str):
        return annotation.strip().strip("'\"")
    return getattr(annotation, "__name__", repr(annotation))


def check_hookspec(spec: Callable[..., Any], package: str) -> list[str]:
    """What ``spec`` lacks against the rules above; an empty list when it follows them.

    Args:
        spec: the hook specification function.
        package: the package that declares it and must export its argument types
            (``"acme_widgets"``).

    Examples:
        >>> def rallypoint_thing_happened(info):
        ...     '''Called when a thing happens.'''
        >>> check_hookspec(rallypoint_thing_happened, "rallypoint.core")[0]
        'rallypoint_thing_happened: its docstring has no example (add an Example:: block)'
    """
    name = spec.__name__
    doc = inspect.getdoc(spec) or ""
    problems = []
    if "Example" not in doc:
        problems.append(f"{name}: its docstring has no example (add an Example:: block)")
    if name in MECHANISM_HOOKS:
        return problems
    exported = importlib.import_module(package)
    for parameter in inspect.signature(spec).parameters.values():
        where = f"{name}({parameter.name})"
        if parameter.annotation is inspect.Parameter.empty:
            problems.append(f"{where}: no type annotation; annotate it with a record exported by {package}")
            continue
        type_name = _annotation_name(parameter.annotation)
        if type_name in ("Any", "typing.Any", "object"):
            problems.append(f"{where}: annotated {type_name}; use a documented record type exported by {package}")
            continue
        if type_name not in getattr(exported, "__all__", ()):
            problems.append(f"{where}: its type {type_name} is not exported by {package} (add it to __all__)")
            continue
        record = getattr(exported, type_name)
        if not inspect.isclass(record) or not inspect.getdoc(record):
            problems.append(f"{where}: {package}.{type_name} is not a documented class")
        if f"{parameter.name}:" not in doc.split("Args:", 1)[-1] or "Args:" not in doc:
            problems.append(f"{where}: the docstring's Args: section does not describe {parameter.name}")
    return problems


def installed_hookspecs(pm: Any) -> Iterator[tuple[Callable[..., Any], str]]:
    """Every hook specification of ``pm`` with the package that declares it."""
    for name in sorted(vars(pm.hook)):
        caller = getattr(pm.hook, name)
        if name.startswith("_") or not caller.has_spec():
            continue
        function = caller.spec.function
        module = function.__module__
        yield function, module.removesuffix(".hookspecs")
