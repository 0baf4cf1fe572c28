"""Griffe extension for the docs build: read the reST bits of our docstrings as Markdown.

The source docstrings follow the Google style but name other objects with Sphinx roles
(``:func:`get_plugin_manager` ``, ``:class:`~rallypoint.core.records.CliCommand` ``) and introduce
code blocks with ``Example::``. Markdown shows those roles as literal text, so before the
docstrings are parsed this extension:

- turns each role into an optional cross-reference: a link when the target is documented on
  some page, plain code otherwise (``~`` keeps only the last name, as in Sphinx);
- turns a paragraph ending in ``::`` into one ending in ``:`` (the indented block after it is
  already a Markdown code block);
- gives an attribute without a docstring the ``#:`` comment lines right above it, the Sphinx
  way of documenting module constants and class attributes.

It changes nothing in the packages themselves. Loaded by ``mkdocs.yml``
(``plugins.mkdocstrings.handlers.python.options.extensions``).
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

_ROLE = re.compile(
    r":(?:py:)?(?:func|class|meth|attr|data|mod|exc|obj|const|type):"
    r"`(?P<text>[^`<]*?)(?:\s*<(?P<target>[^`>]+)>)?`"
)
_LITERAL_MARKER = re.compile(r"(?<=\S)::[ \t]*$", flags=re.MULTILINE)


def _resolve(obj: griffe.Object, name: str) -> str:
    """Full path of ``name`` as seen from ``obj`` (unchanged when it cannot be resolved)."""
    head, dot, rest = name.partition(".")
    try:
        return obj.resolve(head) + dot + rest
    except Exception:  # noqa: BLE001 - griffe raises several kinds; an unresolved name stays as written
        return name


def _docstring_from_comments(obj: griffe.Object) -> None:
    """Use the ``#:`` lines directly above an attribute as its docstring."""
    if obj.lineno is None or obj.filepath is None or isinstance(obj.filepath, list):
        return
    try:
        lines = obj.lines_collection[obj.filepath]
    except KeyError:
        return
    found: list[str] = []
    index = obj.lineno - 2  # the line above the assignment (lineno is 1-based)
    while 0 <= index < len(lines) and lines[index].strip().startswith("#:"):
        found.append(lines[index].strip()[2:].strip())
        index -= 1
    if found:
        obj.docstring = griffe.Docstring("\n".join(reversed(found)), lineno=obj.lineno, parent=obj)


class RstRoles(griffe.Extension):
    """Rewrite reST roles and ``::`` markers in every docstring before it is parsed."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite the docstring of ``obj`` (called by griffe once the object tree is complete)."""
        if obj.is_attribute and obj.docstring is None:
            _docstring_from_comments(obj)
        docstring = obj.docstring
        if docstring is None or (":" not in docstring.value):
            return

        def replace(match: re.Match[str]) -> str:
            text = match["text"].strip()
            target = (match["target"] or text).strip().lstrip("~")
            if match["target"] is None and text.startswith("~"):
                text = text[1:].rsplit(".", 1)[-1]
            identifier = _resolve(obj, target)
            return (
                f'<autoref identifier="{html.escape(identifier, quote=True)}" optional>'
                f"<code>{html.escape(text)}</code></autoref>"
            )

        value = _ROLE.sub(replace, docstring.value)
        docstring.value = _LITERAL_MARKER.sub(":", value)
