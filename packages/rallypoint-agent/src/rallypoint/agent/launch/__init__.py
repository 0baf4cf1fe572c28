"""Launch environments: the schedulers that start agents (Slurm, Kubernetes), detected and applied.

A launch environment (a plugin kind, :data:`~rallypoint.agent.records.LAUNCH_ENVIRONMENTS`)
detects that the agent was started by its scheduler and gives the job's shape
(:class:`LaunchFacts`); :func:`resolve_in_environment` fills in from it what the user did not
give, and :func:`launch_settings` is its share of the node's plan.
"""

from rallypoint.agent.launch.apply import detect, launch_overrides, resolve_in_environment
from rallypoint.agent.launch.facts import LaunchFacts
from rallypoint.agent.launch.hostlist import HostListError, expand_hostlist
from rallypoint.agent.launch.settings import LaunchSettings, launch_settings

__all__ = [
    "HostListError",
    "LaunchFacts",
    "LaunchSettings",
    "detect",
    "expand_hostlist",
    "launch_overrides",
    "launch_settings",
    "resolve_in_environment",
]
