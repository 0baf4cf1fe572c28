"""The NCCL plugin's record: what the facade and ``auto`` read from it (no GPU needed)."""

from __future__ import annotations

from rallypoint.collectives.records import Availability
from rallypoint.collectives.selection import backends_by_torch_name
from rallypoint.core.plugins import get_plugin_manager
from rallypoint_nccl.availability import check


def test_nccl_is_a_stream_ordered_cuda_backend_preferred_over_gloo() -> None:
    records = backends_by_torch_name(get_plugin_manager())
    nccl = records["nccl"]
    assert nccl.device == "cuda"
    assert nccl.stream_ordered is True  # the CPU does not wait; NCCL's watchdog enforces timeouts
    assert nccl.default_timeout == 600.0
    assert nccl.options_model is None
    assert nccl.priority > records["gloo"].priority  # auto prefers it where it can run


def test_availability_says_why() -> None:
    availability = check()
    assert isinstance(availability, Availability)
    assert availability.reason
