"""Launch environments: the schedulers that start agents (Slurm, Kubernetes), detected and applied.

A launch environment (a plugin kind, :data:`~rallypoint.agent.records.LAUNCH_ENVIRONMENTS`)
detects that the agent was started by its scheduler and gives the job's shape
(:class:`LaunchFacts`); :func:`launch_overrides` fills in from it what the user did not give.
"""

from rallypoint.agent.launch.apply import detect, launch_overrides
from rallypoint.agent.launch.facts import LaunchFacts
from rallypoint.agent.launch.hostlist import HostListError, expand_hostlist

__all__ = ["HostListError", "LaunchFacts", "detect", "expand_hostlist", "launch_overrides"]
