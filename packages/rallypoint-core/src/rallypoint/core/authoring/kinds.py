"""The kinds of plugin ``rallypoint plugin new`` can write, and what each one's distribution needs.

This module is data: it imports no subsystem. A kind names the distributions its generated
plugin depends on (by name, as ``pip`` sees them) and the template directory it adds to the
common files.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KINDS", "TemplateKind", "kind_named"]


@dataclass(frozen=True)
class TemplateKind:
    """One kind of plugin the template writes.

    Attributes:
        name: the ``KIND`` argument of ``rallypoint plugin new`` (``rank-strategy``...).
        summary: one line for ``--help`` and the generated README.
        hook: the hook the generated plugin implements first (for the README and ``plugin check``).
        requires: the rallypoint distributions the plugin depends on at run time.
        testing: the distributions (with extras) its tests need, for its ``[testing]`` extra
            (``rallypoint-agent`` where the tests run a job with ``rallypoint run``).
        third_party: other run-time dependencies (``torch`` for collective backends).
        selects: the job-file key that selects it, or ``""`` when nothing selects it.
        conformance_kit: the module of the conformance kit its tests run, or ``""`` when none exists.
    """

    name: str
    summary: str
    hook: str
    requires: tuple[str, ...]
    testing: tuple[str, ...]
    third_party: tuple[str, ...] = ()
    selects: str = ""
    conformance_kit: str = ""


KINDS: tuple[TemplateKind, ...] = (
    TemplateKind(
        name="rendezvous-backend",
        summary="a rendezvous backend: the key-value space the agents meet in",
        hook="rallypoint_rendezvous_backends",
        requires=("rallypoint-rendezvous",),
        testing=("rallypoint-rendezvous[testing]", "rallypoint-agent"),
        selects="rendezvous.backend",
        conformance_kit="rallypoint.rendezvous.testing",
    ),
    TemplateKind(
        name="rank-strategy",
        summary="a rank strategy: which global rank every worker gets",
        hook="rallypoint_rank_strategies",
        requires=("rallypoint-agent",),
        testing=("rallypoint-agent[testing]",),
        selects="ranks.strategy",
        conformance_kit="rallypoint.agent.ranks.testing",
    ),
    TemplateKind(
        name="collective-backend",
        summary="a collective backend: the torch process-group backend workers use",
        hook="rallypoint_collective_backends",
        requires=("rallypoint-collectives",),
        testing=("rallypoint-collectives[testing]", "rallypoint-agent"),
        third_party=("torch>=2.4",),
        selects="collectives.backend",
        conformance_kit="rallypoint.collectives.testing",
    ),
    TemplateKind(
        name="timer-backend",
        summary="a watchdog timer backend: how workers reach the agent's watchdog",
        hook="rallypoint_timer_backends",
        requires=("rallypoint-timer",),
        testing=("rallypoint-timer[testing]", "rallypoint-agent"),
        selects="timer.watchdog",
    ),
    TemplateKind(
        name="rpc-transport",
        summary="an RPC transport: how rallypoint.rpc frames travel between workers",
        hook="rallypoint_rpc_transports",
        requires=("rallypoint-rpc",),
        testing=("rallypoint-rpc[testing]", "rallypoint-agent"),
        selects="rpc.transport",
    ),
    TemplateKind(
        name="cli-command",
        summary="a subcommand of the rallypoint command line",
        hook="rallypoint_cli_commands",
        requires=("rallypoint-core",),
        testing=("rallypoint-core[testing]", "rallypoint-agent"),
    ),
    TemplateKind(
        name="hooks",
        summary="lifecycle and decision hooks: worker environment, failures, restarts",
        hook="rallypoint_worker_env",
        requires=("rallypoint-agent",),
        testing=("rallypoint-agent[testing]",),
    ),
)


def kind_named(name: str) -> TemplateKind:
    """The kind called ``name``.

    Raises:
        KeyError: no kind has that name (the message lists the kinds).
    """
    for kind in KINDS:
        if kind.name == name:
            return kind
    raise KeyError(f"no plugin kind {name!r}; kinds: {', '.join(k.name for k in KINDS)}")
