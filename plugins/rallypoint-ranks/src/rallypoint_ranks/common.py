"""Helpers shared by the strategies: errors, natural order, host patterns.

The strategies build their results with :func:`rallypoint.agent.ranks.assign_blocks` (nodes in
an order) and :func:`rallypoint.agent.ranks.assign_ranks` (a global rank per worker).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import TypeVar

from rallypoint.agent.ranks import RankAssignmentError, RankNode
from rallypoint.core.errors import EXIT_USAGE

__all__ = [
    "LABEL_NAME_RE",
    "RankStrategyError",
    "describe_node",
    "is_pattern",
    "match_host",
    "natural_key",
]

V = TypeVar("V")

_DIGITS_RE = re.compile(r"(\d+)")
#: Valid label names (the keys of ``RALLYPOINT_NODE_LABELS``).
LABEL_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_PATTERN_CHARS = frozenset("*?[")

#: A natural sort key: text parts (case-folded) and numbers, then digit counts, then the text.
NaturalKey = tuple[tuple[str | int, ...], tuple[int, ...], str]


class RankStrategyError(RankAssignmentError):
    """A strategy of this plugin cannot assign ranks from its inputs and options.

    The message names the strategy, and the host and the ``[ranks.options]`` entry (or the
    environment variable) involved. Exit code 2: the fix is in the job file or the environment.

    Attributes:
        host: the host involved, if one is.
        entry: the options entry or variable involved, if one is.
    """

    exit_code = EXIT_USAGE

    def __init__(self, strategy: str, detail: str, *, host: str | None = None, entry: str | None = None) -> None:
        self.host = host
        self.entry = entry
        super().__init__(strategy, detail, raised=True)


def natural_key(text: str) -> NaturalKey:
    """Sort key ordering runs of digits by their value: ``node7`` before ``node66``.

    Text parts compare case-insensitively and numbers by value; leading zeros (``7`` before
    ``07``), then the text itself (``Node7`` before ``node7``), break the remaining ties, so
    different strings never compare equal.

    Examples:
        >>> sorted(["node66", "node7", "Node10", "node07", "node7.b"], key=natural_key)
        ['node7', 'node07', 'node7.b', 'Node10', 'node66']
    """
    parts: list[str | int] = []
    widths: list[int] = []
    for index, part in enumerate(_DIGITS_RE.split(text)):
        # re.split with one group alternates text (even) and digits (odd): positions never mix types.
        if index % 2:
            parts.append(int(part))
            widths.append(len(part))
        else:
            parts.append(part.casefold())
    return (tuple(parts), tuple(widths), text)


def is_pattern(entry: str) -> bool:
    """Whether an options key is a glob pattern (contains ``*``, ``?`` or ``[``)."""
    return any(char in _PATTERN_CHARS for char in entry)


def match_host(host: str, entries: Mapping[str, V]) -> list[str]:
    """The keys of ``entries`` that name ``host``: its exact entry alone, else every matching pattern.

    Patterns are shell-style globs (:func:`fnmatch.fnmatchcase`: ``*``, ``?``, ``[abc]``,
    ``[0-9]``), matched case-sensitively against the whole host name. Returned in the order
    written.
    """
    if host in entries:
        return [host]
    return [key for key in entries if is_pattern(key) and fnmatchcase(host, key)]


def describe_node(node: RankNode) -> str:
    """``host 'gpu-3' (node 'n3')``: how messages name a node."""
    if node.node_id == node.host:
        return f"host {node.host!r}"
    return f"host {node.host!r} (node {node.node_id!r})"
