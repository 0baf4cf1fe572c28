"""Typed registration records.

Registration hooks (``rallypoint_<subsystem>_<things>``, one per plugin kind) return iterables of these
frozen dataclasses. Every record has a ``name``, optional ``aliases`` and a one-line ``summary``;
each kind adds its own typed fields in a subclass that lives with its subsystem.

Heavy code is never imported to build a record: implementations are named by an import path
(``"acme_widgets.backend:WidgetBackend"``) and loaded with :func:`load_object` only when the
plugin is actually used.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rallypoint.core.errors import MissingDependencyError, PluginError

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = [
    "BackendRecord",
    "CliCommand",
    "PluginRecord",
    "Requirement",
    "load_object",
    "normalize_name",
]

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


def normalize_name(name: str) -> str:
    """Normalise a plugin name: lower case, ``_`` and ``-`` treated alike, spaces stripped.

    >>> normalize_name(" My_Backend ")
    'my-backend'
    """
    return name.strip().lower().replace("_", "-")


def load_object(path: str) -> Any:
    """Import ``"package.module:attribute"`` and return the attribute.

    Raises:
        PluginError: the module or attribute does not exist.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise PluginError(f"invalid import path {path!r}: write it as 'package.module:attribute'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise PluginError(f"cannot import {module_name!r} (for {path!r}): {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise PluginError(f"{module_name!r} has no attribute {attr!r} (for {path!r})") from exc
    return obj


@dataclass(frozen=True, kw_only=True)
class Requirement:
    """A Python module a plugin needs at run time, and how to install it.

    Attributes:
        module: the importable module name, e.g. ``"acme_sdk"``.
        install: what to give to ``pip install``, e.g. ``"acme-sdk-python"``.
    """

    module: str
    install: str

    def is_met(self) -> bool:
        """Whether the module can be imported (checked without importing it)."""
        try:
            return importlib.util.find_spec(self.module) is not None
        except (ImportError, ValueError):
            return False


@dataclass(frozen=True, kw_only=True)
class PluginRecord:
    """Common base of every registration record.

    Attributes:
        name: the name users select in config, e.g. ``"acme"``. Lower case letters, digits,
            ``-`` and ``_``; compared after :func:`normalize_name`.
        aliases: other accepted names.
        summary: one line shown by ``rallypoint plugins list``.
    """

    name: str
    aliases: tuple[str, ...] = ()
    summary: str = ""

    def __post_init__(self) -> None:
        for candidate in (self.name, *self.aliases):
            if not isinstance(candidate, str) or not _NAME_RE.match(normalize_name(candidate)):
                raise PluginError(
                    f"invalid plugin name {candidate!r} in {type(self).__name__}: use lower case "
                    f"letters, digits, '-' and '_', starting with a letter or digit"
                )

    @property
    def names(self) -> tuple[str, ...]:
        """The normalised name followed by the normalised aliases."""
        return (normalize_name(self.name), *(normalize_name(a) for a in self.aliases))


@dataclass(frozen=True, kw_only=True)
class BackendRecord(PluginRecord):
    """A record for something selected by name in the job file and configured by an options table.

    Attributes:
        factory: import path of the implementation, loaded only when used.
        options_model: pydantic model validating the plugin's ``options`` table
            (``[widgets.options]`` for a widget backend selected by ``widgets.backend``); ``None`` accepts no options.
        requires: Python modules the implementation needs; a selected plugin whose requirement is
            missing is a clear error naming the ``pip install`` to run.
    """

    factory: str = ""
    options_model: type[BaseModel] | None = None
    requires: tuple[Requirement, ...] = ()

    def check_requirements(self, kind: str) -> None:
        """Raise :class:`MissingDependencyError` for the first requirement that is not met."""
        for req in self.requires:
            if not req.is_met():
                raise MissingDependencyError(kind, self.name, req.module, req.install)

    def load(self) -> Any:
        """Import and return the implementation named by :attr:`factory`."""
        if not self.factory:
            raise PluginError(f"{type(self).__name__} {self.name!r} names no factory")
        return load_object(self.factory)


@dataclass(frozen=True, kw_only=True)
class CliCommand(PluginRecord):
    """A ``rallypoint`` subcommand contributed by a package or plugin.

    Attributes:
        command: import path of a :class:`click.Command` (or a zero-argument callable returning
            one); imported only when the subcommand runs or its help is shown.
    """

    command: str | Callable[[], Any] = field(default="")

    def load(self) -> Any:
        """Return the :class:`click.Command` for this subcommand."""
        import click

        obj = load_object(self.command) if isinstance(self.command, str) else self.command
        if not isinstance(obj, click.Command) and callable(obj):
            obj = obj()
        if not isinstance(obj, click.Command):
            raise PluginError(f"CLI command {self.name!r} ({self.command!r}) is not a click command")
        return obj
