"""``torchrun --rdzv-backend rallypoint-file --rdzv-endpoint DIR``: the file backend for torch's agent.

Registered in the ``torchrun.handlers`` entry-point group; torch calls :func:`torchrun_creator`
with no arguments. torch is imported only when the creator runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _open(run_id: str, params: Any) -> Any:
    from rallypoint_file.backend import FileBackend

    if not params.endpoint:
        raise ValueError("rallypoint-file needs --rdzv-endpoint DIR (a directory every node can reach)")
    poll = params.get("poll_interval")
    return FileBackend(params.endpoint, run_id, poll_interval=0.01 if poll is None else float(poll))


def torchrun_creator() -> Callable[[Any], Any]:
    """Return the creator torch registers as ``rallypoint-file``."""

    def create(params: Any) -> Any:
        from rallypoint.rendezvous.torch_compat import torch_handler_creator

        return torch_handler_creator("rallypoint-file", _open)(params)

    return create
