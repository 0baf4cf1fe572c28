"""Whether Gloo can run here. Imports torch, so it is only called when Gloo is considered."""

from __future__ import annotations

from rallypoint.collectives.records import Availability


def check() -> Availability:
    """Gloo is available when this torch build has torch.distributed with Gloo compiled in."""
    try:
        import torch.distributed as dist
    except ImportError as exc:
        return Availability(False, f"torch cannot be imported ({exc}); pip install torch")
    if not dist.is_available():
        return Availability(False, "this torch build has no torch.distributed support")
    if not dist.is_gloo_available():
        return Availability(False, "this torch build was compiled without Gloo")
    return Availability(True, "Gloo is compiled into this torch build")
