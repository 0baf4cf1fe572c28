"""Every hook specification of the installed packages documents what its hooks receive.

Lifecycle and decision hooks take typed records exported by the package that declares them,
described in the docstring's Args section, and every specification shows an example
(:func:`rallypoint.core.authoring.specs.check_hookspec`). Core's own tests cannot see the other
packages (they run as if core were alone), so this check lives here.
"""

from __future__ import annotations

from typing import Any

from rallypoint.core.authoring.specs import check_hookspec, installed_hookspecs
from rallypoint.core.plugins import get_plugin_manager

LIFECYCLE_AND_DECISION = {
    "rallypoint_agent_should_restart",
    "rallypoint_agent_worker_failed",
    "rallypoint_agent_workers_started",
    "rallypoint_worker_env",
    "rallypoint_rendezvous_completed",
    "rallypoint_rendezvous_timed_out",
}


def test_every_installed_hookspec_has_an_example_and_documented_record_arguments() -> None:
    specs = list(installed_hookspecs(get_plugin_manager()))

    assert {spec.__name__ for spec, _ in specs} >= LIFECYCLE_AND_DECISION
    assert [problem for spec, package in specs for problem in check_hookspec(spec, package)] == []


def rallypoint_agent_paused(reason: Any) -> None:
    """Called when the agent pauses.

    Args:
        reason: why.
    """


def rallypoint_agent_resumed(context: WorkerContext) -> None:  # noqa: F821 - checked by name, never resolved
    """Called when the agent resumes, with a record but no example.

    Args:
        context: the worker context.
    """


def rallypoint_agent_moved(failure) -> None:
    """Called when the agent moves.

    Example::

        @hookimpl
        def rallypoint_agent_moved(failure): ...
    """


def rallypoint_agent_waited(failure: NotExported) -> None:  # noqa: F821
    """Called when the agent waits.

    Example::

        @hookimpl
        def rallypoint_agent_waited(failure): ...
    """


def rallypoint_agent_stopped(failure: WorkerFailure) -> None:  # noqa: F821
    """Called when the agent stops, with an exported record the docstring does not describe.

    Example::

        @hookimpl
        def rallypoint_agent_stopped(failure): ...
    """


def test_a_hookspec_lacking_an_example_or_a_record_type_is_reported() -> None:
    assert check_hookspec(rallypoint_agent_paused, "rallypoint.agent") == [
        "rallypoint_agent_paused: its docstring has no example (add an Example:: block)",
        "rallypoint_agent_paused(reason): annotated Any; use a documented record type exported by rallypoint.agent",
    ]
    assert check_hookspec(rallypoint_agent_resumed, "rallypoint.agent") == [
        "rallypoint_agent_resumed: its docstring has no example (add an Example:: block)",
    ]
    assert check_hookspec(rallypoint_agent_moved, "rallypoint.agent") == [
        "rallypoint_agent_moved(failure): no type annotation; annotate it with a record exported by rallypoint.agent",
    ]
    assert check_hookspec(rallypoint_agent_waited, "rallypoint.agent") == [
        "rallypoint_agent_waited(failure): its type NotExported is not exported by rallypoint.agent "
        "(add it to __all__)",
    ]
    assert check_hookspec(rallypoint_agent_stopped, "rallypoint.agent") == [
        "rallypoint_agent_stopped(failure): the docstring's Args: section does not describe failure",
    ]
