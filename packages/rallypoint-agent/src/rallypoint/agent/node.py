"""A node's identity: what the agent publishes about its node in the rendezvous.

Every agent publishes one record about its node (:class:`rallypoint.rendezvous.state.NodeInfo`):
its id, host name and address, its number of workers, its *labels* (where it is: rack, zone,
switch...) and the scheduler variables it was started with. :func:`node_record` builds that
record; the labels come from the node's labels file and its ``RALLYPOINT_NODE_LABELS`` variable
(:func:`read_node_labels`), in the ``key=value`` syntax of :func:`parse_node_labels`.

After a round, :meth:`RankNode.from_participant <rallypoint.agent.ranks.RankNode.from_participant>`
turns every participant's record into the :class:`~rallypoint.agent.ranks.RankNode` that rank
strategies read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from rallypoint.core.errors import RallypointError

if TYPE_CHECKING:
    from rallypoint.rendezvous.state import NodeInfo

__all__ = [
    "NODE_LABELS_ENV",
    "NODE_LABELS_FILE_ENV",
    "NodeLabelsError",
    "default_node_id",
    "node_record",
    "parse_node_labels",
    "read_node_labels",
]

#: The environment variable in which a node publishes its labels (``"rack=r1,zone=z2"``).
NODE_LABELS_ENV = "RALLYPOINT_NODE_LABELS"
#: The environment variable naming a file of this node's labels (same syntax, one pair a line).
NODE_LABELS_FILE_ENV = "RALLYPOINT_NODE_LABELS_FILE"

_LABEL_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


class NodeLabelsError(RallypointError, ValueError):
    """Node labels (``RALLYPOINT_NODE_LABELS`` or a labels file) that cannot be parsed.

    ``str(error)`` names where the labels came from, the offending item and what is wrong.

    Attributes:
        source: where the text came from, e.g. ``"RALLYPOINT_NODE_LABELS"`` or a file path.
        item: the offending item, as written.
    """

    exit_code = 2

    def __init__(self, source: str, item: str, problem: str) -> None:
        self.source = source
        self.item = item
        super().__init__(
            f"invalid node labels in {source}: {item!r}: {problem}. "
            f"Write labels as key=value pairs separated by commas or new lines, e.g. rack=r1,zone=z2"
        )


def parse_node_labels(text: str, *, source: str = NODE_LABELS_ENV) -> dict[str, str]:
    """Parse node labels written as ``key=value`` pairs, e.g. ``"rack=r1,zone=z2"``.

    The same syntax serves the ``RALLYPOINT_NODE_LABELS`` variable and a labels file: pairs are
    separated by commas or new lines; white space around keys, values and pairs is ignored, as
    are empty pairs and lines starting with ``#``. A key starts with a letter or ``_`` and holds
    letters, digits, ``_``, ``.`` and ``-``; a value is any non-empty text without ``,`` or ``=``
    (quotes are not special).

    Args:
        text: the labels.
        source: where the text came from, for the error message.

    Returns:
        The labels, in the order written.

    Raises:
        NodeLabelsError: a pair without ``=``, an empty or malformed key, an empty value, a value
            containing ``=``, or a key given twice.

    Examples:
        >>> parse_node_labels(" rack=r1, zone = z2 ,")
        {'rack': 'r1', 'zone': 'z2'}
        >>> try:
        ...     parse_node_labels("rack=r1,zone")
        ... except NodeLabelsError as error:
        ...     print(str(error).split(". ")[0])
        invalid node labels in RALLYPOINT_NODE_LABELS: 'zone': expected key=value
    """
    labels: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip().startswith("#"):
            continue
        for raw in line.split(","):
            item = raw.strip()
            if not item:
                continue
            key, sep, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not sep:
                raise NodeLabelsError(source, item, "expected key=value")
            if not key:
                raise NodeLabelsError(source, item, "the key is empty")
            if not _LABEL_KEY_RE.match(key):
                raise NodeLabelsError(
                    source, item, f"invalid key {key!r} (use letters, digits, '_', '.' and '-', starting with a letter)"
                )
            if not value:
                raise NodeLabelsError(source, item, f"label {key!r} has an empty value")
            if "=" in value:
                raise NodeLabelsError(source, item, f"the value of {key!r} contains '='")
            if key in labels:
                raise NodeLabelsError(source, item, f"label {key!r} is given twice (first as {labels[key]!r})")
            labels[key] = value
    return labels


#: The most a node labels file may hold.
MAX_LABELS_FILE_BYTES = 64 * 1024


def read_node_labels(
    environ: Mapping[str, str] | None = None, labels_file: str | os.PathLike[str] | None = None
) -> dict[str, str]:
    """The labels a node publishes: its labels file, then its ``RALLYPOINT_NODE_LABELS``.

    Both use the syntax of :func:`parse_node_labels`. A label set in both takes the variable's
    value (the more specific source wins, as everywhere in rallypoint's configuration).

    Args:
        environ: the node's environment (default :data:`os.environ`).
        labels_file: a file of labels on this node, or ``None``.

    Raises:
        NodeLabelsError: either source cannot be parsed, or the file cannot be read.

    Examples:
        >>> read_node_labels({"RALLYPOINT_NODE_LABELS": "rack=r7"})
        {'rack': 'r7'}
    """
    env = os.environ if environ is None else environ
    labels: dict[str, str] = {}
    if labels_file is not None:
        path = Path(labels_file)
        try:
            with path.open("rb") as handle:  # a labels file is small: never read a device to its end
                raw = handle.read(MAX_LABELS_FILE_BYTES + 1)
            if len(raw) > MAX_LABELS_FILE_BYTES:
                raise NodeLabelsError(
                    str(path), str(path), f"the labels file is larger than {MAX_LABELS_FILE_BYTES // 1024} KiB"
                )
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise NodeLabelsError(str(path), str(path), f"cannot read the labels file: {exc}") from exc
        labels.update(parse_node_labels(text, source=str(path)))
    labels.update(parse_node_labels(env.get(NODE_LABELS_ENV, ""), source=NODE_LABELS_ENV))
    return labels


def default_node_id(host: str, pid: int) -> str:
    """The node id of an agent not given one: ``<host>-<pid>``, unique among the agents of a job.

    Examples:
        >>> default_node_id("gpu-3", 4242)
        'gpu-3-4242'
    """
    return f"{host}-{pid}"


def node_record(
    *,
    host: str,
    addr: str,
    local_world_size: int,
    environ: Mapping[str, str],
    node_id: str | None = None,
    pid: int | None = None,
) -> NodeInfo:
    """The record this node publishes in the rendezvous.

    Args:
        host: the node's host name.
        addr: the address other nodes and this node's workers reach it at.
        local_world_size: how many workers the node runs.
        environ: the agent's environment: the node's labels (``RALLYPOINT_NODE_LABELS``, and
            the file ``RALLYPOINT_NODE_LABELS_FILE`` names) and the scheduler variables
            (:func:`rallypoint.agent.env.scheduler_env`) come from it.
        node_id: the node's id; default :func:`default_node_id` of ``host`` and ``pid``.
        pid: the agent's process id (default: this process's).

    Raises:
        NodeLabelsError: the labels cannot be read or parsed.

    Examples:
        >>> node = node_record(host="gpu-3", addr="10.0.0.3", local_world_size=8, pid=7,
        ...                    environ={"RALLYPOINT_NODE_LABELS": "rack=r2", "SLURM_PROCID": "3"})
        >>> node.node_id, dict(node.labels), dict(node.env)
        ('gpu-3-7', {'rack': 'r2'}, {'SLURM_PROCID': '3'})
    """
    from rallypoint.agent.env import scheduler_env
    from rallypoint.rendezvous.state import NodeInfo

    return NodeInfo(
        node_id=node_id or default_node_id(host, os.getpid() if pid is None else pid),
        host=host,
        addr=addr,
        local_world_size=local_world_size,
        labels=read_node_labels(environ, environ.get(NODE_LABELS_FILE_ENV)),
        env=scheduler_env(environ),
    )
