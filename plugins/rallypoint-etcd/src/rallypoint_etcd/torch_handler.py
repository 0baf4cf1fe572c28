"""``torchrun --rdzv-backend rallypoint-etcd --rdzv-endpoint HOST:PORT``: the etcd backend for torch's agent.

Registered in the ``torchrun.handlers`` entry-point group; torch calls :func:`torchrun_creator`
with no arguments. ``--rdzv-endpoint`` sets ``endpoints``, ``--rdzv-conf key=value`` any other field of
:class:`~rallypoint_etcd.options.EtcdOptions` (see :mod:`rallypoint.rendezvous.torchrun_handlers`).
Nothing is imported until torchrun opens the rendezvous.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rallypoint.rendezvous.torchrun_handlers import torchrun_creator as _creator


def torchrun_creator() -> Callable[[Any], Any]:
    """Return the creator torch registers as ``rallypoint-etcd``."""
    return _creator(
        "rallypoint-etcd",
        hook="rallypoint_etcd.hooks:rallypoint_rendezvous_backends",
        backend="etcd",
        endpoint_hint="HOST:PORT (an etcd client endpoint)",
    )
