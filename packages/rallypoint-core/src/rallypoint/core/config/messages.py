"""Turning pydantic validation errors into :class:`~rallypoint.core.errors.ConfigIssue` items.

Every issue names where the value came from (file, ``RALLYPOINT_*`` variable or flag), its key
path (``widgets.options.endpoints[1]``) and the problem in words, with the known keys and the
closest one when a key is unknown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from rallypoint.core.config.sections import FIELDS_CTX
from rallypoint.core.errors import ConfigIssue, did_you_mean

__all__ = ["issues_from_validation"]

#: What :meth:`LoadedConfig.source_of` answers for a key set nowhere.
DEFAULT_LABEL = "default"

#: Said of an unknown section: sections come from installed packages.
MISSING_PACKAGE_HINT = (
    "Sections are declared by installed packages: if [{name}] belongs to one that is missing or disabled, "
    "install or enable it (see rallypoint plugins list)"
)


def _format_loc(loc: Iterable[int | str]) -> str:
    out = ""
    for part in loc:
        if part == "[key]":  # pydantic's mark of an error in a table's key, rather than its value
            continue
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
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"a {len(str(abs(value)))}-digit number"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _message(
    error: Mapping[str, Any], model: type[BaseModel], loc: tuple[int | str, ...], *, job_file: bool = False
) -> str:
    kind = error["type"]
    value = error.get("input")
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden" and job_file and len(loc) == 1:
        return _unknown_section(str(loc[0]), sorted(model.model_fields))
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
        return f"must be {words[0]} {ctx.get(words[1])}, got {_describe_input(value)}"
    if kind == "literal_error":
        return f"expected {ctx.get('expected')}, got {_describe_input(value)}"
    msg = str(error.get("msg", "invalid value"))
    return msg.removeprefix("Value error, ")


def _unknown_section(name: str, known: list[str]) -> str:
    text = f"unknown section [{name}]"
    guess = did_you_mean(name, known)
    if guess:
        text += f"; did you mean [{guess}]?"
    text += f" (known sections: {', '.join(known) if known else 'none'}). "
    return text + MISSING_PACKAGE_HINT.format(name=name)


def issues_from_validation(
    exc: ValidationError,
    model: type[BaseModel],
    *,
    prefix: tuple[int | str, ...] = (),
    source_of: Callable[[str], str] | None = None,
    job_file: bool = False,
    is_explicit: Callable[[str], bool] | None = None,
) -> list[ConfigIssue]:
    """Turn a pydantic :class:`ValidationError` into :class:`ConfigIssue` items.

    Args:
        exc: the validation error.
        model: the model that was validated (used to list known keys).
        prefix: key path of that model inside the job file (``("widgets", "options")``).
        source_of: callable from a key path to the label of where it was set.
        job_file: ``model`` is a whole job file: an unknown top-level key is an unknown section,
            and the message says that sections come from installed packages.
        is_explicit: callable from a key path to whether it was set (not a default); an error
            about several keys (:func:`~rallypoint.core.config.sections.cross_field_error`) is
            located at the first one that was.
    """
    issues = []
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        fields = (error.get("ctx") or {}).get(FIELDS_CTX)
        if fields:
            issues.append(_cross_field_issue(error, prefix + loc, tuple(fields), source_of, is_explicit))
            continue
        key = _format_loc(prefix + loc)
        source = source_of(key) if source_of else None
        issues.append(ConfigIssue(source, key, _message(error, model, loc, job_file=job_file)))
    return issues


def _cross_field_issue(
    error: Mapping[str, Any],
    loc: tuple[int | str, ...],
    fields: tuple[str, ...],
    source_of: Callable[[str], str] | None,
    is_explicit: Callable[[str], bool] | None,
) -> ConfigIssue:
    """A section validator's error about several keys: located at the first one that was set."""
    message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    keys = [_format_loc((*loc, name)) for name in fields]
    if source_of is None:
        return ConfigIssue(None, keys[0], message)
    explicit = [is_explicit(key) if is_explicit else True for key in keys]
    sources = [source_of(key) if set_here else DEFAULT_LABEL for key, set_here in zip(keys, explicit, strict=True)]
    # blame the first key that was set (a default cannot be the mistake when another key was set)
    first = next((i for i, set_here in enumerate(explicit) if set_here), 0)
    elsewhere = [
        f"{key} {'is the default' if src == DEFAULT_LABEL else 'from ' + src}"
        for key, src in zip(keys, sources, strict=True)
        if src != sources[first]
    ]
    if elsewhere:
        message += f" ({'; '.join(elsewhere)})"
    return ConfigIssue(source_of(keys[first]), keys[first], message)
