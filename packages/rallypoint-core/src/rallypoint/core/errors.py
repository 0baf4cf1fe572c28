"""Errors a user can act on.

Every rallypoint error says what happened, where (file, key, plugin, process or host) and what to
do next. The CLI turns a :class:`RallypointError` into a one-paragraph message on stderr and exits
with :attr:`RallypointError.exit_code`; it never prints a bare traceback for one.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "ConfigError",
    "ConfigIssue",
    "MissingDependencyError",
    "PluginConflictError",
    "PluginError",
    "PluginLoadError",
    "RallypointError",
    "UnknownPluginError",
    "did_you_mean",
]

#: Exit code for usage and configuration errors (bad file, unknown key, unknown plugin name).
EXIT_USAGE = 2
#: Exit code for a failure at run time that is not the user's input.
EXIT_FAILURE = 1


class RallypointError(Exception):
    """Base of every error rallypoint raises on purpose.

    ``str(error)`` is the complete message shown to the user.
    """

    #: Process exit code the CLI uses for this error.
    exit_code: int = EXIT_FAILURE


class PluginError(RallypointError):
    """Something is wrong with an installed plugin or a plugin selection."""

    exit_code = EXIT_USAGE


def did_you_mean(name: str, candidates: Iterable[str]) -> str | None:
    """Return the closest candidate to ``name``, or ``None`` when nothing is close.

    >>> did_you_mean("acem", ["acme", "plain", "bent"])
    'acme'
    """
    matches = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


class UnknownPluginError(PluginError):
    """A name was looked up in a registry that has no such entry.

    Attributes:
        kind: what was looked up, e.g. ``"widget backend"``.
        name: the name asked for.
        available: the names that do exist.
        where: where the name came from, e.g. ``"widgets.backend in job.toml"``.
        suggestion: the closest available name, if any.
    """

    def __init__(
        self,
        kind: str,
        name: str,
        available: Iterable[str],
        *,
        where: str | None = None,
        broken: Iterable[str] = (),
    ) -> None:
        self.kind = kind
        self.name = name
        self.available = sorted(available)
        self.where = where
        self.suggestion = did_you_mean(name, self.available)
        self.broken = sorted(broken)
        parts = [f"unknown {kind} {name!r}"]
        if where:
            parts[0] += f" ({where})"
        parts.append("available: " + (", ".join(self.available) if self.available else "none installed"))
        if self.suggestion:
            parts.append(f"did you mean {self.suggestion!r}?")
        if self.broken:
            parts.append("plugins that failed to load: " + ", ".join(self.broken))
        hint = "Install plugins with pip install rallypoint-<name>; see rallypoint plugins list"
        text = "; ".join(parts)
        super().__init__(text + ("" if text.endswith("?") else ".") + " " + hint)


class PluginConflictError(PluginError):
    """Two plugins registered the same name for the same kind."""

    def __init__(self, kind: str, name: str, first: str, second: str) -> None:
        self.kind = kind
        self.name = name
        self.providers = (first, second)
        super().__init__(
            f"{kind} {name!r} is registered twice: by {first} and by {second}. "
            f"Uninstall one of them, or disable one with RALLYPOINT_DISABLE_PLUGINS=<plugin>"
        )


class PluginLoadError(PluginError):
    """A plugin could not be imported or registered."""

    def __init__(self, plugin: str, distribution: str, cause: BaseException) -> None:
        # "dist 1.0", or "plugin (dist 1.0)": the reinstall hint names the distribution
        distribution = distribution.partition("(")[2].rstrip(")") if "(" in distribution else distribution
        self.plugin = plugin
        self.distribution = distribution
        self.cause = cause
        dist = distribution.split()[0] if distribution and not distribution.startswith("unknown") else None
        reinstall = f"Reinstall it (pip install --force-reinstall {dist}), or" if dist else "Fix it, or"
        super().__init__(
            f"plugin {plugin!r} ({distribution}) failed to load: {type(cause).__name__}: {cause}. "
            f"{reinstall} disable it with RALLYPOINT_DISABLE_PLUGINS={plugin}"
        )


class MissingDependencyError(PluginError):
    """A selected plugin needs a Python module that is not installed."""

    def __init__(self, kind: str, name: str, module: str, install: str) -> None:
        self.kind = kind
        self.name = name
        self.module = module
        self.install = install
        super().__init__(
            f"{kind} {name!r} needs the Python module {module!r}, which is not installed. "
            f"Install it with: pip install {install}"
        )


class ConfigIssue:
    """One problem found in a job configuration.

    Attributes:
        source: where the value came from: a file path, ``RALLYPOINT_X (environment)`` or
            ``--set (command line)``; ``None`` for a default.
        key: the dotted key path, e.g. ``widgets.options.endpoints[1]``; empty for the
            whole file.
        message: what is wrong and, where possible, how to write it instead.
    """

    __slots__ = ("key", "message", "source")

    def __init__(self, source: str | None, key: str, message: str) -> None:
        self.source = source
        self.key = key
        self.message = message

    def __str__(self) -> str:
        parts = [p for p in (self.source, self.key) if p]
        return ": ".join([*parts, self.message])

    def __repr__(self) -> str:
        return f"ConfigIssue({self.source!r}, {self.key!r}, {self.message!r})"


class ConfigError(RallypointError):
    """The job configuration is invalid. Carries every issue found, not only the first."""

    exit_code = EXIT_USAGE

    def __init__(self, issues: Iterable[ConfigIssue]) -> None:
        self.issues = list(issues)
        super().__init__("\n".join(str(i) for i in self.issues))
