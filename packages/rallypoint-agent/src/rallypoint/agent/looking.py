"""Opening a job's rendezvous backend only to look at it: for ``rallypoint status`` and ``debug stacks``.

A command that reads a job must never change what the job runs on. Two backend options, by
name, would let it: ``read_only`` (the ``file`` backend: ``False`` creates the run's directory
for a mistyped path or run id) and ``serve`` (the ``grpc`` backend, torchrun's ``c10d``:
``"auto"`` makes the first process to bind the endpoint host the rendezvous server, so a
``status --watch`` started before the job would serve the job's rendezvous, and take it down
when interrupted). :func:`looking_only` sets both, where the selected backend has them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

__all__ = ["looking_only"]


def looking_only(selection: Any, *, read_only: bool = True) -> Any:
    """``selection`` with its options set never to host a server and, with ``read_only``, never to write.

    Args:
        selection: the ``rendezvous.backend`` selection of a resolved job
            (:class:`rallypoint.core.config.resolve.Selection`).
        read_only: also set ``read_only`` (``debug stacks`` writes its request: ``False`` there).
    """
    options = selection.options
    if options is None:
        return selection
    fields = type(options).model_fields
    update: dict[str, Any] = {}
    if read_only and "read_only" in fields:
        update["read_only"] = True
    if "serve" in fields:
        update["serve"] = "never"
    return replace(selection, options=options.model_copy(update=update)) if update else selection
