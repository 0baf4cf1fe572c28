"""Loading a job: defaults < TOML file < ``RALLYPOINT_*`` environment < command-line flags.

Environment overrides are ``RALLYPOINT_<SECTION>_<KEY>``, e.g. ``RALLYPOINT_NODES_MAX=4`` or
``RALLYPOINT_RENDEZVOUS_JOIN_TIMEOUT=5m``; a plugin option is
``RALLYPOINT_<SECTION>_OPTIONS_<NAME>``. Values are read as TOML values when they parse as one
(``4``, ``true``, ``["a", "b"]``) and as plain strings otherwise. Variables whose second word is
not a section name (``RALLYPOINT_DISABLE_PLUGINS``...) are not configuration.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from rallypoint.core.config.models import SECTIONS, JobConfig
from rallypoint.core.errors import ConfigError, ConfigIssue, did_you_mean

__all__ = ["ENV_PREFIX", "LoadedConfig", "issues_from_validation", "load_job_config", "parse_value"]

ENV_PREFIX = "RALLYPOINT_"
DEFAULT_SOURCE = "default"


@dataclass
class LoadedConfig:
    """A validated job configuration and where each value came from.

    Attributes:
        config: the validated model (phase 1).
        path: the job file, if one was given.
        sources: for each key path that was set explicitly, where it was set: the file path,
            ``"RALLYPOINT_X (environment)"`` or ``"--flag (command line)"``.
    """

    config: JobConfig
    path: Path | None
    sources: dict[str, str] = field(default_factory=dict)

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
    """
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


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


def env_overrides(environ: Mapping[str, str]) -> list[tuple[str, Any, str]]:
    """The configuration overrides in ``environ`` as ``(key path, value, source label)``.

    >>> env_overrides({"RALLYPOINT_NODES_MAX": "4", "RALLYPOINT_DISABLE_PLUGINS": "x"})
    [('nodes.max', 4, 'RALLYPOINT_NODES_MAX (environment)')]
    """
    found = []
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX):
            continue
        rest = var[len(ENV_PREFIX) :].lower()
        section, _, key = rest.partition("_")
        if section not in SECTIONS or not key:
            continue
        if key.startswith("options_") and len(key) > len("options_"):
            key = "options." + key[len("options_") :]
        found.append((f"{section}.{key}", parse_value(environ[var]), f"{var} (environment)"))
    return found


def _format_loc(loc: Iterable[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out


def _model_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    current: Any = model
    for part in loc:
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or not isinstance(part, str):
            return None
        info = current.model_fields.get(part)
        if info is None:
            return None
        annotation = info.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        current = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _describe_input(value: Any) -> str:
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def _message(error: Mapping[str, Any], model: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    kind = error["type"]
    value = error.get("input")
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden":
        parent = _model_at(model, loc[:-1])
        known = sorted(parent.model_fields) if parent else []
        where = f" in [{_format_loc(loc[:-1])}]" if loc[:-1] else ""
        text = f"unknown key {loc[-1]!r}{where}"
        guess = did_you_mean(str(loc[-1]), known)
        if guess:
            text += f"; did you mean {guess!r}?"
        if known:
            text += f" (known keys: {', '.join(known)})"
        return text
    if kind == "missing":
        return "required key is missing"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"expected an integer, got {_describe_input(value)}"
    if kind in ("float_parsing", "float_type"):
        return f"expected a number, got {_describe_input(value)}"
    if kind in ("bool_parsing", "bool_type"):
        return f"expected true or false, got {_describe_input(value)}"
    if kind == "string_type":
        return f"expected a string, got {_describe_input(value)}"
    if kind == "list_type":
        return f"expected a list, got {_describe_input(value)}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return f"expected a table, got {_describe_input(value)}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        words = {
            "greater_than_equal": ("at least", "ge"),
            "greater_than": ("greater than", "gt"),
            "less_than_equal": ("at most", "le"),
            "less_than": ("less than", "lt"),
        }[kind]
        return f"must be {words[0]} {ctx.get(words[1])}, got {value!r}"
    if kind == "literal_error":
        return f"expected {ctx.get('expected')}, got {_describe_input(value)}"
    msg = str(error.get("msg", "invalid value"))
    return msg.removeprefix("Value error, ")


def issues_from_validation(
    exc: ValidationError,
    model: type[BaseModel],
    *,
    prefix: tuple[int | str, ...] = (),
    source_of: Any = None,
) -> list[ConfigIssue]:
    """Turn a pydantic :class:`ValidationError` into :class:`ConfigIssue` items.

    Args:
        exc: the validation error.
        model: the model that was validated (used to list known keys).
        prefix: key path of that model inside the job file (``("rendezvous", "options")``).
        source_of: callable from a key path to the label of where it was set.
    """
    issues = []
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        key = _format_loc(prefix + loc)
        source = source_of(key) if source_of else None
        issues.append(ConfigIssue(source, key, _message(error, model, loc)))
    return issues


def load_job_config(
    path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Iterable[tuple[str, Any, str]] = (),
) -> LoadedConfig:
    """Load and validate (phase 1) a job.

    Args:
        path: the TOML job file; ``None`` for a job made of defaults and overrides only.
        environ: where to read ``RALLYPOINT_*`` overrides (default :data:`os.environ`).
        overrides: command-line overrides as ``(key path, value, source label)``, applied last;
            e.g. ``("nodes.nproc_per_node", 2, "--nproc-per-node (command line)")``.

    Raises:
        ConfigError: the file cannot be read or parsed, or a value is invalid. Each issue names
            the file (or variable, or flag), the key path and the problem.

    Example:
        >>> loaded = load_job_config(None, environ={"RALLYPOINT_NODES_MAX": "4"})
        >>> loaded.config.nodes.max, loaded.source_of("nodes.max")
        (4, 'RALLYPOINT_NODES_MAX (environment)')
    """
    env = os.environ if environ is None else environ
    data: dict[str, Any] = {}
    sources: dict[str, str] = {}
    file_path = Path(path) if path is not None else None
    if file_path is not None:
        label = str(file_path)
        try:
            raw = file_path.read_bytes()
        except FileNotFoundError:
            raise ConfigError([ConfigIssue(label, "", "no such file; check the path")]) from None
        except IsADirectoryError:
            raise ConfigError([ConfigIssue(label, "", "is a directory; give the path of a .toml job file")]) from None
        except OSError as exc:
            raise ConfigError([ConfigIssue(label, "", f"cannot read: {exc.strerror or exc}")]) from None
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise ConfigError([ConfigIssue(label, "", "is not UTF-8 text; a job file is TOML")]) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError([ConfigIssue(label, "", f"invalid TOML: {exc}")]) from None
        for key in _walk_keys(data):
            sources[key] = label
    for key, value, source in [*env_overrides(env), *overrides]:
        _set_path(data, key, value)
        # the value replaces whatever was below ``key``: forget where the old values came from
        for stale in [k for k in sources if k.startswith(key + ".")]:
            del sources[stale]
        sources[key] = source
        if isinstance(value, Mapping):
            for sub in _walk_keys(value, key + "."):
                sources[sub] = source
    loaded = LoadedConfig(JobConfig.model_construct(), file_path, sources)
    try:
        loaded.config = JobConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(issues_from_validation(exc, JobConfig, source_of=loaded.source_of)) from None
    if loaded.config.job.name is None and file_path is not None:
        loaded.config.job.name = file_path.stem
    return loaded
