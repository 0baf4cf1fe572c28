"""The ``[rpc]`` section of the job file, declared by this package.

It is optional: a job has it only when it uses ``rallypoint.rpc`` (``resolved.config.rpc`` is
``None`` otherwise). ``transport`` is a plain name here; core's resolution looks it up among the
RPC transports (:data:`~rallypoint.rpc.records.RPC_TRANSPORTS`) and validates
``[rpc.options]`` with the selected transport's ``options_model``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from rallypoint.core.config import ConfigSection, Duration, ResolvedConfig, Section, section_env

__all__ = ["RPC_SECTION", "RpcSection", "worker_env"]


def _pattern(value: str) -> str:
    from rallypoint.rpc.exposure import allow_pattern_problem

    problem = allow_pattern_problem(value)
    if problem:
        raise PydanticCustomError("allow_pattern", "{problem}", {"problem": problem})
    return value


class RpcSection(Section):
    """``[rpc]``: present only in jobs that use ``rallypoint.rpc``."""

    transport: str = Field(default="grpc", description="RPC transport.")
    serializer: Literal["safe", "pickle"] = Field(
        default="safe", description='How values travel; "pickle" is an explicit opt-in.'
    )
    mode: Literal["rallypoint", "torch"] = Field(
        default="rallypoint",
        description='"torch": the program\'s own functions and classes are callable without @rpc.expose.',
    )
    timeout: Duration = Field(default=60.0, description="Default timeout of a call (0: none).")
    allow: list[Annotated[str, AfterValidator(_pattern)]] = Field(
        default_factory=list,
        description='Modules whose public functions and classes peers may call ("pkg" or "pkg.*").',
    )
    num_worker_threads: int = Field(default=16, ge=1, le=1024, description="Threads that run incoming calls.")
    options: dict[str, Any] = Field(default_factory=dict, description="The transport's own options.")


def worker_env(resolved: ResolvedConfig, base: Path) -> dict[str, str]:
    """The resolved ``[rpc]`` as ``RALLYPOINT_RPC_*`` variables, for ``RpcOptions.from_environment``.

    Whatever set a value (the job file, ``--set``, the agent's environment), the workers get the
    value the agent resolved, with the transport's options as validated.
    """
    del base
    return section_env(resolved, "rpc")


#: The section as this package declares it (``rallypoint_config_sections``): optional.
RPC_SECTION = ConfigSection(
    "rpc", RpcSection, "remote procedure calls between workers", optional=True, worker_env=worker_env
)
