"""``torchrun --rdzv-backend rallypoint-grpc --rdzv-endpoint HOST:PORT``: the grpc backend for torch's agent.

Registered in the ``torchrun.handlers`` entry-point group; torch calls :func:`torchrun_creator` with
no arguments. ``--rdzv-endpoint`` sets ``endpoint``, ``--rdzv-conf key=value`` any other field of
:class:`~rallypoint_grpc.rendezvous.options.GrpcOptions` (see
:mod:`rallypoint.rendezvous.torchrun_handlers`). As with torch's own c10d backend, the agent on the
host that owns the endpoint's address serves (``--rdzv-conf serve=never`` turns that off, for a
standalone ``rallypoint rdzv serve``). Nothing is imported until torchrun opens the rendezvous.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rallypoint.rendezvous.torchrun_handlers import torchrun_creator as _creator


def torchrun_creator() -> Callable[[Any], Any]:
    """Return the creator torch registers as ``rallypoint-grpc``."""
    return _creator(
        "rallypoint-grpc",
        hook="rallypoint_grpc.hooks:rallypoint_rendezvous_backends",
        backend="grpc",
        endpoint_hint="HOST:PORT (the rendezvous server every node reaches)",
    )
