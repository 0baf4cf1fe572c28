"""The kinds of plugin ``rallypoint plugin new`` can write, as the installed packages declare them.

Core names no subsystem here either: each package that accepts a kind of plugin declares what a
plugin of that kind needs (:class:`TemplateKind`: its distributions, hook, job-file key,
conformance kit) and ships the kind's templates itself, through the
``rallypoint_plugin_templates`` hook. Core declares its own kind, ``cli-command``, the same way.
A kind is offered only when the package declaring it is installed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["TemplateKind", "installed_kinds", "kind_named"]

_KIND_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
_TEMPLATES_RE = re.compile(r"^[A-Za-z_][\w.]*:[\w./-]+$")


@dataclass(frozen=True)
class TemplateKind:
    """One kind of plugin ``rallypoint plugin new`` writes, declared by the package that accepts it.

    Attributes:
        name: the ``KIND`` argument of ``rallypoint plugin new`` (``rank-strategy``...).
        summary: one line for ``--help`` and the generated README.
        hook: the hook the generated plugin implements first (for the README and ``plugin check``).
        requires: the rallypoint distributions the plugin depends on at run time.
        testing: the distributions (with extras) its tests need, for its ``[testing]`` extra
            (add the agent's distribution where the tests run a job with ``rallypoint run``).
        templates: where the kind's template files are, ``"<package>:<directory>"``: a directory
            of the importable ``<package>`` (shipped in its wheel). Its files (``.tmpl``) are
            added to core's common ones (``pyproject.toml``, ``README.md``...) and replace those
            of the same path.
        impl: the name of the generated implementation module (``backend``, ``strategy``...),
            for the README.
        expected: what each worker of the generated example job writes (``"<rank>=<text>"``,
            ``__NAME__`` standing for the plugin's name): the generated job test's expectation.
        third_party: other run-time dependencies (``torch>=2.4`` for collective backends).
        selects: the job-file key that selects it, or ``""`` when nothing selects it.
        conformance_kit: the module of the conformance kit its tests run, or ``""`` when none exists.

    Example:
        >>> kind = TemplateKind(
        ...     name="widget-backend", summary="a widget backend", hook="rallypoint_widget_backends",
        ...     requires=("acme-widgets",), testing=("acme-widgets[testing]",),
        ...     templates="acme_widgets:plugin_templates/widget-backend", impl="backend",
        ...     expected=("0=made", "1=made"), selects="widgets.backend")
        >>> kind.package, kind.directory
        ('acme_widgets', 'plugin_templates/widget-backend')
    """

    name: str
    summary: str
    hook: str
    requires: tuple[str, ...]
    testing: tuple[str, ...]
    templates: str
    impl: str
    expected: tuple[str, ...] = ()
    third_party: tuple[str, ...] = ()
    selects: str = ""
    conformance_kit: str = ""

    def __post_init__(self) -> None:
        problem = None
        if not _KIND_RE.fullmatch(self.name):
            problem = f"name {self.name!r} must be lower-case words joined by '-', e.g. 'widget-backend'"
        elif not _TEMPLATES_RE.fullmatch(self.templates):
            problem = f"templates {self.templates!r} must be '<package>:<directory>'"
        elif not self.impl.isidentifier():
            problem = f"impl {self.impl!r} must be a module name"
        if problem:
            raise ValueError(f"TemplateKind: {problem}")

    @property
    def package(self) -> str:
        """The importable package that holds the templates."""
        return self.templates.partition(":")[0]

    @property
    def directory(self) -> str:
        """The templates' directory inside :attr:`package`."""
        return self.templates.partition(":")[2]


def installed_kinds(pm: Any) -> tuple[TemplateKind, ...]:
    """Every kind the installed packages declare (``rallypoint_plugin_templates``), sorted by name.

    Args:
        pm: the plugin manager whose packages are asked
            (:func:`rallypoint.core.plugins.get_plugin_manager`).

    Raises:
        TypeError: a package returned something else than :class:`TemplateKind` records.
        ValueError: two packages declare the same kind name.
    """
    found: dict[str, TemplateKind] = {}
    results: Iterable[Iterable[Any]] = pm.hook.rallypoint_plugin_templates()
    for declared in results:
        for kind in declared:
            if not isinstance(kind, TemplateKind):
                raise TypeError(f"rallypoint_plugin_templates returned {kind!r}, not a TemplateKind")
            if kind.name in found and found[kind.name] != kind:
                raise ValueError(
                    f"two installed packages declare the plugin kind {kind.name!r} "
                    f"(templates {found[kind.name].templates!r} and {kind.templates!r}); uninstall one"
                )
            found[kind.name] = kind
    return tuple(found[name] for name in sorted(found))


def kind_named(name: str, kinds: Iterable[TemplateKind]) -> TemplateKind:
    """The kind called ``name`` among ``kinds``.

    Raises:
        KeyError: no kind has that name (the message lists the kinds).
    """
    known = list(kinds)
    for kind in known:
        if kind.name == name:
            return kind
    names = ", ".join(k.name for k in known) or "none (no installed package declares one)"
    raise KeyError(f"no plugin kind {name!r}; kinds: {names}")
