"""The pluggy project's name and its two markers, the only things a hook module needs from core.

``@hookspec`` marks a hook specification (an empty function whose signature is the contract),
``@hookimpl`` a hook implementation (a function named after the hook). They live apart from the
plugin manager (:mod:`rallypoint.core.plugins`, which re-exports them) so that a module of hook
specifications or implementations never imports the manager that loads it.
"""

from __future__ import annotations

import pluggy

__all__ = ["PROJECT_NAME", "hookimpl", "hookspec"]

#: The pluggy project every rallypoint hook belongs to.
PROJECT_NAME = "rallypoint"
#: Marker for hook specifications: ``@hookspec`` on an empty function whose signature is the contract.
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
#: Marker for hook implementations: ``@hookimpl`` on a function named after the hook.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
