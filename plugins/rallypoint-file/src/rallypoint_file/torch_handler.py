"""``torchrun --rdzv-backend rallypoint-file --rdzv-endpoint DIR``: the file backend for torch's agent.

Registered in the ``torchrun.handlers`` entry-point group; torch calls :func:`torchrun_creator`
with no arguments. torch is imported only when the creator runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _open(run_id: str, params: Any) -> Any:
    """The file backend for torch's ``RendezvousParameters``, validated with :class:`FileOptions`.

    torchrun's arguments come from no job file, so this is where they are checked: the endpoint
    is ``path``, ``--rdzv-conf poll_interval=...,group=...`` the poll interval and the sharing group.
    """
    from pydantic import ValidationError

    from rallypoint_file.backend import FileBackend
    from rallypoint_file.options import FileOptions

    if not params.endpoint:
        raise ValueError("rallypoint-file needs --rdzv-endpoint DIR (a directory every node can reach)")
    raw = {"path": params.endpoint}
    for name in ("poll_interval", "group"):
        value = params.get(name)
        if value is not None:
            raw[name] = value
    try:
        opts = FileOptions.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"rallypoint-file: invalid --rdzv-endpoint/--rdzv-conf: {problems}") from None
    return FileBackend(opts.path, run_id, poll_interval=opts.poll_interval, group=opts.group)


def torchrun_creator() -> Callable[[Any], Any]:
    """Return the creator torch registers as ``rallypoint-file``."""

    def create(params: Any) -> Any:
        from rallypoint.rendezvous.torch_compat import torch_handler_creator

        return torch_handler_creator("rallypoint-file", _open)(params)

    return create
