"""Loading a job: defaults < TOML file < ``RALLYPOINT_*`` environment < command-line flags.

The sections a job file may have are the ones installed packages declare (a
:class:`~rallypoint.core.config.sections.JobSchema`, usually ``pm.job_schema()``).

Environment overrides are ``RALLYPOINT_<SECTION>_<KEY>`` for a declared section, e.g.
``RALLYPOINT_WIDGETS_COUNT=4`` when a package declares ``[widgets]``; a plugin option is
``RALLYPOINT_<SECTION>_OPTIONS_<NAME>``. Values are read as TOML values when they parse as one
(``4``, ``true``, ``["a", "b"]``) and as plain strings otherwise. Variables whose second word is
not a declared section name (``RALLYPOINT_DISABLE_PLUGINS``...) are not configuration.
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pydantic import ValidationError

from rallypoint.core.config.messages import DEFAULT_LABEL, issues_from_validation
from rallypoint.core.config.sections import JobSchema, Section
from rallypoint.core.errors import ConfigError, ConfigIssue

__all__ = [
    "ENV_PREFIX",
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "LoadedConfig",
    "SchemaSource",
    "env_overrides",
    "issues_from_validation",
    "load_job_config",
    "parse_value",
]

S = TypeVar("S", bound=Section)


class SchemaSource(Protocol):
    """Anything that knows the job schema: a plugin manager (``pm.job_schema()``)."""

    def job_schema(self) -> JobSchema:
        """The schema of the installed packages' sections."""
        ...


ENV_PREFIX = "RALLYPOINT_"
DEFAULT_SOURCE = DEFAULT_LABEL
#: The most a job file may hold; a job file is a few kilobytes of TOML.
MAX_FILE_BYTES = 1024 * 1024
#: How deeply tables and lists may nest in a job file, a ``RALLYPOINT_*`` value or ``--set``.
MAX_DEPTH = 32


@dataclass
class LoadedConfig:
    """A validated job configuration and where each value came from.

    Attributes:
        config: the validated job (phase 1), an instance of ``schema.model``: each declared
            section is an attribute (``loaded.config.widgets``); an optional section the
            job does not have is ``None``. Typed code uses :meth:`section` instead.
        schema: the sections the job was validated against.
        path: the job file, if one was given.
        sources: for each key path that was set explicitly, where it was set: the file path,
            ``"RALLYPOINT_X (environment)"`` or ``"--flag (command line)"``.
    """

    config: Any
    schema: JobSchema
    path: Path | None
    sources: dict[str, str] = field(default_factory=dict)

    def section(self, model: type[S]) -> S:
        """The job's section validated by ``model``, typed.

        Raises:
            LookupError: no declared section has this model (its package is disabled), or the
                section is optional and the job does not have it (see :meth:`section_or_none`).
        """
        found = self.section_or_none(model)
        if found is None:
            raise LookupError(f"the job has no [{self.schema.name_of(model)}] section")
        return found

    def section_or_none(self, model: type[S]) -> S | None:
        """Like :meth:`section`, but ``None`` for an optional section the job does not have."""
        name = self.schema.name_of(model)
        if name is None:
            raise LookupError(
                f"no installed package declares a job-file section with model {model.__name__} "
                f"(declared: {', '.join(self.schema.names) or 'none'})"
            )
        value = getattr(self.config, name)
        if value is not None and not isinstance(value, model):
            raise TypeError(f"[{name}] is a {type(value).__name__}, not a {model.__name__}")
        return value

    def source_of(self, key: str, *, inherit: bool = True) -> str:
        """Where ``key`` was set; ``"default"`` if nowhere.

        Args:
            key: a key path, possibly with list indices (``"job.args[1]"``, which was set where
                ``job.args`` was).
            inherit: when ``key`` itself was not set, answer for the closest enclosing key that
                was (right for locating an error); ``False`` answers ``"default"`` instead (right
                for showing where a value comes from).
        """
        probe = key
        while probe.endswith("]") and "[" in probe:  # an item is set where its list is
            probe = probe[: probe.rindex("[")]
        if probe in self.sources:
            return self.sources[probe]
        below = [source for k, source in self.sources.items() if k.startswith(probe + ".")]
        if inherit and below:  # ``a.b.c = 1`` made ``a.b`` a table: whoever set ``a.b.c`` set it
            return below[-1]
        while inherit and probe:
            probe = probe.rpartition(".")[0]
            while probe.endswith("]") and "[" in probe:
                probe = probe[: probe.rindex("[")]
            if probe in self.sources:
                return self.sources[probe]
        return DEFAULT_SOURCE

    def is_explicit(self, key: str) -> bool:
        """Whether ``key`` or a key beneath it was set by the file, environment or command line."""
        return any(k == key or k.startswith(key + ".") for k in self.sources)


def parse_value(text: str) -> Any:
    """Read a value given as text (env var or ``--set``): a TOML value if it is one, else the string.

    >>> parse_value("4"), parse_value("5m"), parse_value('["a", "b"]'), parse_value("true")
    (4, '5m', ['a', 'b'], True)

    Raises:
        ValueError: the value nests tables or lists more than :data:`MAX_DEPTH` levels deep.
    """
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, ValueError):  # ValueError: an integer of more than 4300 digits
        return text
    except RecursionError:
        raise ValueError(_too_deep()) from None
    if _too_deep_at(value) is not None:
        raise ValueError(_too_deep())
    return value


def _too_deep() -> str:
    return f"tables and lists nest more than {MAX_DEPTH} levels deep (the most a job accepts); flatten the value"


def _too_deep_at(value: Any, prefix: str = "") -> str | None:
    """The key path of the first value nested deeper than :data:`MAX_DEPTH`, if any.

    Iterative, since the value may be hostile. ``""`` means the value itself.
    """
    stack: list[tuple[Any, str, int]] = [(value, prefix, 0)]
    while stack:
        item, path, level = stack.pop()
        if isinstance(item, Mapping):
            children: Iterable[tuple[str, Any]] = ((f"{path}.{k}" if path else str(k), v) for k, v in item.items())
        elif isinstance(item, list):
            children = ((f"{path}[{i}]", v) for i, v in enumerate(item))
        else:
            continue
        if level + 1 > MAX_DEPTH:
            return path
        stack.extend((child, child_path, level + 1) for child_path, child in children)
    return None


#: Said of a key or value holding a NUL character, anywhere in a job.
NUL_MESSAGE = "holds a NUL character (\\0): no command line, variable, path or name can hold one"


def _keys_with_nul(data: Mapping[str, Any]) -> list[str]:
    """The key paths of keys and strings holding a NUL character (iteratively: the data may be hostile)."""
    found = []
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if "\0" in item:
                found.append(path)
        elif isinstance(item, Mapping):
            for key, value in item.items():
                child = f"{path}.{key}" if path else str(key)
                if "\0" in str(key):
                    found.append(child.replace("\0", "\\0"))
                else:
                    stack.append((value, child))
        elif isinstance(item, list):
            stack.extend((value, f"{path}[{i}]") for i, value in enumerate(item))
    return sorted(found)


def _set_path(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def _walk_keys(data: Mapping[str, Any], prefix: str = "") -> Iterable[str]:
    for key, value in data.items():
        path = f"{prefix}{key}"
        yield path
        if isinstance(value, Mapping):
            yield from _walk_keys(value, path + ".")


def env_overrides(environ: Mapping[str, str], sections: Iterable[str]) -> list[tuple[str, Any, str]]:
    """The configuration overrides in ``environ`` as ``(key path, value, source label)``.

    Args:
        environ: the environment.
        sections: the declared section names; other ``RALLYPOINT_*`` variables are not
            configuration.

    Raises:
        ConfigError: a value nests deeper than :data:`MAX_DEPTH`; each issue names the variable.

    >>> env_overrides({"RALLYPOINT_WIDGETS_COUNT": "4", "RALLYPOINT_DISABLE_PLUGINS": "x"}, ["widgets"])
    [('widgets.count', 4, 'RALLYPOINT_WIDGETS_COUNT (environment)')]
    """
    names = set(sections)
    found = []
    issues = []
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX):
            continue
        rest = var[len(ENV_PREFIX) :].lower()
        section, _, key = rest.partition("_")
        if section not in names or not key:
            continue
        if key.startswith("options_") and len(key) > len("options_"):
            key = "options." + key[len("options_") :]
        label = f"{var} (environment)"
        try:
            found.append((f"{section}.{key}", parse_value(environ[var]), label))
        except ValueError as exc:
            issues.append(ConfigIssue(label, f"{section}.{key}", str(exc)))
    if issues:
        raise ConfigError(issues)
    return found


def _read_bytes(file_path: Path, label: str) -> bytes:
    """The file's bytes, at most :data:`MAX_FILE_BYTES` of them: a job file is never a device."""

    def refuse(message: str) -> ConfigError:
        return ConfigError([ConfigIssue(label, "", message)])

    try:
        mode = file_path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise refuse("is a directory; give the path of a .toml job file")
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISSOCK(mode):
            raise refuse("is a device or socket, not a job file; give the path of a .toml job file")
        if stat.S_ISFIFO(mode):  # opening it would wait for a writer, maybe for ever
            raise refuse("is a named pipe (FIFO), not a job file; write the job to a file and give its path")
        with file_path.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise refuse("no such file; check the path") from None
    except OSError as exc:
        raise refuse(f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        limit = f"{MAX_FILE_BYTES // 1024} KiB"
        raise refuse(f"is larger than {limit}, the most a job file may hold; is it the right file?")
    return raw


def _read_toml(file_path: Path) -> dict[str, Any]:
    label = str(file_path)
    raw = _read_bytes(file_path, label)
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError([ConfigIssue(label, "", "is not UTF-8 text; a job file is TOML")]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([ConfigIssue(label, "", f"invalid TOML: {exc}")]) from None
    except ValueError:  # Python refuses to read integers of more than 4300 digits
        message = "holds an integer of more than 4300 digits; no setting takes a number that large"
        raise ConfigError([ConfigIssue(label, "", message)]) from None
    except RecursionError:
        raise ConfigError([ConfigIssue(label, "", _too_deep())]) from None
    deep = _too_deep_at(data)
    if deep is not None:
        raise ConfigError([ConfigIssue(label, deep, _too_deep())])
    return data


def _apply(data: dict[str, Any], sources: dict[str, str], overrides: Iterable[tuple[str, Any, str]]) -> None:
    """Set each override's value in ``data`` (in order, last wins) and note its source."""
    for key, value, source in overrides:
        _set_path(data, key, value)
        # the value replaces whatever was below ``key``: forget where the old values came from
        for stale in [k for k in sources if k.startswith(key + ".")]:
            del sources[stale]
        sources[key] = source
        if isinstance(value, Mapping):
            for sub in _walk_keys(value, key + "."):
                sources[sub] = source


def load_job_config(
    path: str | os.PathLike[str] | None,
    schema: JobSchema | SchemaSource,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Iterable[tuple[str, Any, str]] = (),
    derived: Callable[[Mapping[str, Any]], Iterable[tuple[str, Any, str]]] | None = None,
) -> LoadedConfig:
    """Load and validate (phase 1) a job.

    Args:
        path: the TOML job file; ``None`` for a job made of defaults and overrides only.
        schema: the sections a job may have: a :class:`JobSchema`, or the plugin manager whose
            installed packages declare them (``pm.job_schema()`` is used).
        environ: where to read ``RALLYPOINT_*`` overrides (default :data:`os.environ`).
        overrides: command-line overrides as ``(key path, value, source label)``, applied last;
            e.g. ``("widgets.count", 2, "--count (command line)")``.
        derived: overrides that depend on the others' result, applied after them: called once
            with the job's values before validation (file, environment and ``overrides``
            merged; keys left out are at their defaults), it returns more overrides. For a flag
            whose key depends on another setting (``--rdzv-endpoint`` sets the option the
            selected backend names), so that the job is read and validated once.

    Raises:
        ConfigError: the file cannot be read or parsed, a section is not declared by any
            installed package, or a value is invalid. Each issue names the file (or variable,
            or flag), the key path and the problem.

    Example:
        >>> from rallypoint.core.config.sections import ConfigSection, Section, build_schema
        >>> class WidgetSection(Section):
        ...     count: int = 1
        >>> schema = build_schema([ConfigSection("widgets", WidgetSection)])
        >>> loaded = load_job_config(None, schema, environ={"RALLYPOINT_WIDGETS_COUNT": "4"})
        >>> loaded.config.widgets.count, loaded.source_of("widgets.count")
        (4, 'RALLYPOINT_WIDGETS_COUNT (environment)')
    """
    if not isinstance(schema, JobSchema):
        schema = schema.job_schema()
    env = os.environ if environ is None else environ
    data: dict[str, Any] = {}
    sources: dict[str, str] = {}
    file_path = Path(path) if path is not None else None
    if file_path is not None:
        data = _read_toml(file_path)
        for key in _walk_keys(data):
            sources[key] = str(file_path)
    _apply(data, sources, [*env_overrides(env, schema.names), *overrides])
    if derived is not None:
        _apply(data, sources, derived(data))
    loaded = LoadedConfig(None, schema, file_path, sources)
    nul = [ConfigIssue(loaded.source_of(key), key, NUL_MESSAGE) for key in _keys_with_nul(data)]
    if nul:
        raise ConfigError(nul)
    try:
        loaded.config = schema.model.model_validate(data)
    except ValidationError as exc:
        issues = issues_from_validation(
            exc, schema.model, source_of=loaded.source_of, job_file=True, is_explicit=loaded.is_explicit
        )
        raise ConfigError(issues) from None
    return loaded
