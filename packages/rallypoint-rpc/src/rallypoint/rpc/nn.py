"""``rallypoint.rpc.nn``: the place of ``torch.distributed.nn``'s RPC names (``RemoteModule``).

``from rallypoint.rpc.nn import RemoteModule`` replaces ``from torch.distributed.nn import
RemoteModule``; it is the same class as :class:`rallypoint.rpc.RemoteModule`.
"""

from __future__ import annotations

from rallypoint.rpc.remote_module import RemoteModule

__all__ = ["RemoteModule"]
