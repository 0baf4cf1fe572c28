"""Why a worker could not be started, said so that the user knows what to change."""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping, Sequence

from rallypoint.core.errors import RallypointError

__all__ = ["WorkerStartError"]


class WorkerStartError(RallypointError):
    """A worker process could not be started (missing executable, bad cwd, no permission, too large a command line).

    Args:
        rank: the worker's global rank.
        argv: its command line.
        cause: what starting it raised.
        env: its environment (``None``: the agent's), measured when the command line was too large.
    """

    def __init__(
        self, rank: int, argv: Sequence[str], cause: BaseException, env: Mapping[str, str] | None = None
    ) -> None:
        self.rank = rank
        self.argv = list(argv)
        self.cause = cause
        what = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(cause)
        if isinstance(cause, OSError) and cause.errno == errno.E2BIG:  # not a path problem: say what is too large
            hint = _too_large(self.argv, os.environ if env is None else env)
        else:
            hint = "Check the entry point path, the working directory and that the file is executable"
        super().__init__(
            f"could not start worker rank {rank} ({self.argv[0] if self.argv else '<empty argv>'}): {what}. {hint}"
        )


def _too_large(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """What made ``execve`` fail with ``E2BIG``, in numbers, and what to do."""
    sizes = [len(os.fsencode(a)) for a in argv]
    env_bytes = sum(len(os.fsencode(k)) + len(os.fsencode(v)) + 2 for k, v in env.items())
    return (
        f"Its arguments hold {sum(sizes) + len(sizes)} bytes (the longest {max(sizes, default=0)}) and its "
        f"environment {env_bytes}; Linux takes at most 128 KiB in one argument or variable, and "
        f"{os.sysconf('SC_ARG_MAX')} bytes of both together: write large data to a file and pass its path"
    )
