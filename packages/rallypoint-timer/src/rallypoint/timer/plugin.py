"""The timer package as a rallypoint plugin (essential entry point ``timer``).

It adds the timer hook specifications, declares the timer-backend kind and the ``[timer]``
section, and registers the ``local`` and ``file`` watchdog backends and the ``timeline`` command.
"""

from __future__ import annotations

from typing import Any

import pluggy

from rallypoint.core.authoring.kinds import TemplateKind
from rallypoint.core.config import ConfigSection
from rallypoint.core.plugins import hookimpl
from rallypoint.core.records import CliCommand
from rallypoint.core.registry import PluginKind
from rallypoint.timer.records import TIMER_BACKENDS, TimerBackendRecord


@hookimpl
def rallypoint_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Make the timer hooks known."""
    from rallypoint.timer import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def rallypoint_plugin_kinds() -> list[PluginKind[Any]]:
    """The timer-backend kind, selected with ``timer.watchdog`` (or ``"off"``)."""
    return [TIMER_BACKENDS]


@hookimpl
def rallypoint_config_sections() -> list[ConfigSection]:
    """``[timer]``."""
    from rallypoint.timer.config import TIMER_SECTION

    return [TIMER_SECTION]


@hookimpl
def rallypoint_timer_backends() -> list[TimerBackendRecord]:
    """The built-in watchdog backends."""
    from rallypoint.timer.options import FileOptions, LocalOptions

    return [
        TimerBackendRecord(
            name="local",
            summary="multiprocessing connection to the agent (same host)",
            factory="rallypoint.timer.backends:LocalWatchdog",
            options_model=LocalOptions,
        ),
        TimerBackendRecord(
            name="file",
            summary="named pipe with JSON lines (torch FileTimer compatible)",
            factory="rallypoint.timer.backends:FileWatchdog",
            options_model=FileOptions,
        ),
    ]


@hookimpl
def rallypoint_cli_commands() -> list[CliCommand]:
    """``rallypoint timeline merge|report``."""
    return [
        CliCommand(
            name="timeline",
            summary="Merge worker event timelines into a Chrome trace; per-step report.",
            command="rallypoint.timer.cli:timeline",
        )
    ]


@hookimpl
def rallypoint_plugin_templates() -> list[TemplateKind]:
    """What ``rallypoint plugin new timer-backend NAME`` writes (templates in ``plugin_templates/``)."""
    return [
        TemplateKind(
            name="timer-backend",
            summary="a watchdog timer backend: how workers reach the agent's watchdog",
            hook="rallypoint_timer_backends",
            requires=("rallypoint-timer",),
            testing=("rallypoint-timer[testing]", "rallypoint-agent"),
            templates="rallypoint.timer:plugin_templates/timer-backend",
            impl="watchdog",
            expected=("0=timed", "1=timed"),
            selects="timer.watchdog",
        )
    ]
