"""``torchrun --rdzv-backend rallypoint-file --rdzv-endpoint DIR``: the file backend for torch's agent.

Registered in the ``torchrun.handlers`` entry-point group; torch calls :func:`torchrun_creator`
with no arguments. ``--rdzv-endpoint`` sets ``path``, ``--rdzv-conf key=value`` any other field of
:class:`~rallypoint_file.options.FileOptions` (see :mod:`rallypoint.rendezvous.torchrun_handlers`).
Nothing is imported until torchrun opens the rendezvous.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rallypoint.rendezvous.torchrun_handlers import torchrun_creator as _creator


def torchrun_creator() -> Callable[[Any], Any]:
    """Return the creator torch registers as ``rallypoint-file``."""
    return _creator(
        "rallypoint-file",
        hook="rallypoint_file.hooks:rallypoint_rendezvous_backends",
        backend="file",
        endpoint_hint="DIR (a directory every node can reach)",
    )
