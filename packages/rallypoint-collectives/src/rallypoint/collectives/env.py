"""The worker environment: torchrun's variables plus ``RALLYPOINT_COLLECTIVES_*``.

The agent (``rallypoint run``) sets, for every worker, what ``torchrun`` sets (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ...) and
``RALLYPOINT_COLLECTIVES_BACKEND`` / ``RALLYPOINT_COLLECTIVES_TIMEOUT``, whose names follow the
config override scheme ``RALLYPOINT_<SECTION>_<KEY>``, and ``RALLYPOINT_COLLECTIVES_OPTIONS``, the
job's ``[collectives.options]`` table as a JSON object. Anyone else may set them too (a
scheduler, ``torchrun``, a test). Importing this module does not import torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rallypoint.core.errors import ConfigError, ConfigIssue

__all__ = [
    "BACKEND_ENV",
    "DEFAULT_BACKEND",
    "DEFAULT_TIMEOUT",
    "OPTIONS_ENV",
    "TIMEOUT_ENV",
    "WorkerEnv",
    "parse_options",
    "parse_timeout",
]

BACKEND_ENV = "RALLYPOINT_COLLECTIVES_BACKEND"
TIMEOUT_ENV = "RALLYPOINT_COLLECTIVES_TIMEOUT"
OPTIONS_ENV = "RALLYPOINT_COLLECTIVES_OPTIONS"
#: ``[collectives] backend`` when nothing sets it.
DEFAULT_BACKEND = "auto"
#: ``[collectives] timeout`` (seconds) when nothing sets it.
DEFAULT_TIMEOUT = 600.0


def parse_timeout(value: object, *, where: str) -> float:
    """A timeout in seconds from a number or a duration string (``"30s"``, ``"5m"``).

    Raises:
        ConfigError: not a positive duration; the message names ``where``.
    """
    from rallypoint.core.config.durations import parse_duration

    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise ConfigError([ConfigIssue(where, "collectives.timeout", str(exc))]) from None
    if seconds <= 0:
        raise ConfigError([ConfigIssue(where, "collectives.timeout", f"must be positive, got {value!r}")])
    return seconds


def parse_options(raw: str | None) -> dict[str, Any]:
    """The ``[collectives.options]`` table from ``RALLYPOINT_COLLECTIVES_OPTIONS`` (a JSON object).

    Unset or blank means no options (``{}``).

    Raises:
        ConfigError: not valid JSON, or not a JSON object; the message names the variable.
    """
    if raw is None or not raw.strip():
        return {}
    where = f"{OPTIONS_ENV} (environment)"
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        message = f"is not valid JSON ({exc.msg} at character {exc.pos}): write a JSON object such as '{{\"k\": 1}}'"
        raise ConfigError([ConfigIssue(where, "collectives.options", message)]) from None
    if not isinstance(value, dict):
        message = f"must be a JSON object (the [collectives.options] table), got {type(value).__name__} {raw.strip()!r}"
        raise ConfigError([ConfigIssue(where, "collectives.options", message)])
    return value


def _int(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError([ConfigIssue(f"{name} (environment)", "", f"expected an integer, got {raw!r}")]) from None


@dataclass(frozen=True)
class WorkerEnv:
    """What a worker learns from its environment.

    Attributes:
        rank: global rank (``RANK``), ``None`` when unset.
        world_size: number of workers (``WORLD_SIZE``).
        local_rank: rank on this node (``LOCAL_RANK``); picks the GPU for CUDA backends.
        local_world_size: workers on this node (``LOCAL_WORLD_SIZE``).
        master_addr: ``MASTER_ADDR``, where torch's store for ``env://`` listens.
        master_port: ``MASTER_PORT``.
        backend: ``RALLYPOINT_COLLECTIVES_BACKEND``, or ``None`` when unset.
        timeout: ``RALLYPOINT_COLLECTIVES_TIMEOUT`` in seconds, or ``None`` when unset.
        options: ``RALLYPOINT_COLLECTIVES_OPTIONS`` parsed (``{}`` when unset); ``init()``
            validates it against the selected backend's ``options_model``.
    """

    rank: int | None
    world_size: int | None
    local_rank: int | None
    local_world_size: int | None
    master_addr: str | None
    master_port: int | None
    backend: str | None
    timeout: float | None
    options: dict[str, Any] = field(default_factory=dict, hash=False)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> WorkerEnv:
        """Read the variables (default :data:`os.environ`).

        Raises:
            ConfigError: a variable is set to something that is not valid, naming it.
        """
        env = os.environ if environ is None else environ
        raw_timeout = env.get(TIMEOUT_ENV)
        timeout = None
        if raw_timeout is not None and raw_timeout.strip():
            timeout = parse_timeout(raw_timeout.strip(), where=f"{TIMEOUT_ENV} (environment)")
        backend = env.get(BACKEND_ENV)
        return cls(
            rank=_int(env, "RANK"),
            world_size=_int(env, "WORLD_SIZE"),
            local_rank=_int(env, "LOCAL_RANK"),
            local_world_size=_int(env, "LOCAL_WORLD_SIZE"),
            master_addr=env.get("MASTER_ADDR") or None,
            master_port=_int(env, "MASTER_PORT"),
            backend=backend.strip() if backend and backend.strip() else None,
            timeout=timeout,
            options=parse_options(env.get(OPTIONS_ENV)),
        )
