"""Whether NCCL can run here. Imports torch, so it is only called when NCCL is considered."""

from __future__ import annotations

from rallypoint.collectives.records import Availability


def check() -> Availability:
    """NCCL is available when torch has NCCL compiled in and at least one CUDA device is visible."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        return Availability(False, f"torch cannot be imported ({exc}); pip install torch")
    if not dist.is_available() or not dist.is_nccl_available():
        return Availability(False, "this torch build has no NCCL (a CPU-only build?)")
    if not torch.cuda.is_available():
        return Availability(False, "no CUDA device is visible (check CUDA_VISIBLE_DEVICES and the driver)")
    return Availability(True, f"NCCL with {torch.cuda.device_count()} visible CUDA device(s)")
