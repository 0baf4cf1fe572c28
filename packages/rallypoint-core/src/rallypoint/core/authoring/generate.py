"""Write a third-party plugin distribution from the templates (``rallypoint plugin new``).

The common templates live next to this module (``templates/_common``); each kind's own templates
live in the package that declares the kind (:attr:`TemplateKind.templates`). Templates are text
files ending in ``.tmpl``. Their paths mirror the generated tree, with ``__module__`` standing for
the import package; their text uses placeholders (``__NAME__``, ``__MODULE__``, ``__CLASS__``...)
replaced by plain substitution, so the templates stay valid-looking Python, TOML and Markdown.
A file of a kind's directory replaces the common file of the same path.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

from rallypoint.core.authoring.kinds import TemplateKind, installed_kinds, kind_named
from rallypoint.core.errors import EXIT_USAGE, RallypointError
from rallypoint.core.plugins import get_plugin_manager

__all__ = ["GeneratedPlugin", "TemplateError", "generate_plugin", "plugin_names"]

_NAME_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
_SUFFIX = ".tmpl"


class TemplateError(RallypointError):
    """``plugin new`` was asked for something it cannot write (exit code 2)."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class GeneratedPlugin:
    """What :func:`generate_plugin` wrote.

    Attributes:
        kind: the kind of plugin.
        name: the plugin's name (the record's name and the entry point's).
        distribution: the distribution's name, ``rallypoint-<name>``.
        module: its import package, ``rallypoint_<name>``.
        root: the directory holding its ``pyproject.toml``.
        files: every file written, relative to ``root``.
    """

    kind: TemplateKind
    name: str
    distribution: str
    module: str
    root: Path
    files: tuple[Path, ...]


def plugin_names(name: str) -> dict[str, str]:
    """The placeholders' values for plugin ``name``.

    Raises:
        TemplateError: ``name`` is not lower-case letters and digits in ``-``-separated words.

    Examples:
        >>> names = plugin_names("fast-ring")
        >>> names["__DIST__"], names["__MODULE__"], names["__CLASS__"], names["__ENVVAR__"]
        ('rallypoint-fast-ring', 'rallypoint_fast_ring', 'FastRing', 'RALLYPOINT_FAST_RING_HOOKS')
    """
    if not _NAME_RE.fullmatch(name):
        raise TemplateError(
            f"NAME: {name!r} is not a plugin name: use lower-case letters and digits, words joined by '-' "
            "(e.g. 'fast-ring'); the distribution becomes rallypoint-NAME"
        )
    words = name.split("-")
    return {
        "__NAME__": name,
        "__DIST__": f"rallypoint-{name}",
        "__MODULE__": "rallypoint_" + "_".join(words),
        "__CLASS__": "".join(w.capitalize() for w in words),
        "__ENVVAR__": "RALLYPOINT_" + "_".join(w.upper() for w in words) + "_HOOKS",
    }


def _version_range() -> str:
    """``>=X.Y,<X.(Y+1)``: the rallypoint release line this core belongs to (members move together)."""
    try:
        version = importlib.metadata.version("rallypoint-core")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        version = "0.1.0"
    major, minor = (int(part) for part in re.findall(r"\d+", version)[:2])
    return f">={major}.{minor},<{major}.{minor + 1}"


def _requirement_lines(names: tuple[str, ...], bound: str) -> str:
    lines = []
    for requirement in names:
        pinned = requirement if requirement.startswith(("torch", "pytest")) else requirement + bound
        lines.append(f'    "{pinned}",\n')
    return "".join(lines)


def _substitutions(kind: TemplateKind, name: str) -> dict[str, str]:
    values = plugin_names(name)
    bound = _version_range()
    testing = (*kind.testing, "pytest>=8", "pytest-xdist>=3.5", "pytest-timeout>=2.3")
    expected = [line.replace("__NAME__", name) for line in kind.expected]
    values.update(
        {
            "__KIND__": kind.name,
            "__SUMMARY__": kind.summary[0].upper() + kind.summary[1:].split(":")[0],
            "__HOOK__": kind.hook,
            "__IMPL__": kind.impl,
            "__DEPENDENCIES__": _requirement_lines((*kind.requires, *kind.third_party), bound),
            "__TESTING__": _requirement_lines(testing, bound),
            "__EXPECTED__": json.dumps(expected),
            "__KIT_NOTE__": " (with rallypoint's conformance kit)" if kind.conformance_kit else "",
            "__SELECTS_NOTE__": f" selecting it (`{kind.selects}`)" if kind.selects else "",
        }
    )
    return values


def _templates(root: Traversable, prefix: Path = Path()) -> dict[Path, Traversable]:
    found: dict[Path, Traversable] = {}
    for item in root.iterdir():
        if item.is_dir():
            found.update(_templates(item, prefix / item.name))
        elif item.name.endswith(_SUFFIX):
            found[prefix / item.name[: -len(_SUFFIX)]] = item
    return found


def _render(text: str, values: dict[str, str]) -> str:
    # longest placeholders first, so that none is a prefix of another one's match
    for key in sorted(values, key=len, reverse=True):
        text = text.replace(key, values[key])
    return text


def _kind_root(kind: TemplateKind) -> Traversable:
    """The directory of the kind's own templates, in the package that declares it."""
    try:
        root = files(kind.package)
    except ModuleNotFoundError as exc:
        raise TemplateError(f"KIND: {kind.name}: its templates' package {kind.package!r} is not importable") from exc
    for part in kind.directory.split("/"):
        root = root / part
    if not root.is_dir():
        raise TemplateError(f"KIND: {kind.name}: no template directory {kind.templates!r}; reinstall {kind.package}")
    return root


def generate_plugin(
    kind_name: str, name: str, directory: Path, *, force: bool = False, kinds: tuple[TemplateKind, ...] | None = None
) -> GeneratedPlugin:
    """Write distribution ``rallypoint-<name>`` of kind ``kind_name`` into ``directory/rallypoint-<name>``.

    Args:
        kind_name: the name of a kind an installed package declares (``rallypoint_plugin_templates``).
        name: the plugin's name (lower case, ``-``-separated words).
        directory: where the distribution's directory is created.
        force: overwrite files of an existing directory.
        kinds: the kinds to choose from (default: :func:`~rallypoint.core.authoring.kinds.installed_kinds`).

    Raises:
        TemplateError: an unknown kind, a bad name, or the target exists (without ``force``).
    """
    try:
        kind = kind_named(kind_name, installed_kinds(get_plugin_manager()) if kinds is None else kinds)
    except KeyError as exc:
        raise TemplateError(f"KIND: {exc.args[0]}") from None
    values = _substitutions(kind, name)
    root = Path(directory) / values["__DIST__"]
    if root.exists() and not force:
        raise TemplateError(f"{root} already exists; choose another --dir or NAME, or pass --force to overwrite")
    common = files("rallypoint.core.authoring") / "templates" / "_common"
    templates = {**_templates(common), **_templates(_kind_root(kind))}
    written = []
    for relative, template in sorted(templates.items()):
        target = Path(_render(str(relative).replace("__module__", values["__MODULE__"]), values))
        text = template.read_text(encoding="utf-8")
        if not text.strip() and target.suffix == ".py":
            continue  # an empty template removes the common file
        (root / target).parent.mkdir(parents=True, exist_ok=True)
        (root / target).write_text(_render(text, values), encoding="utf-8")
        written.append(target)
    return GeneratedPlugin(kind, name, values["__DIST__"], values["__MODULE__"], root, tuple(written))
