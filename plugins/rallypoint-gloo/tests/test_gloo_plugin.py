"""The Gloo plugin's record: what the facade and ``auto`` read from it."""

from __future__ import annotations

from rallypoint.collectives.records import Availability
from rallypoint.collectives.selection import backends_by_torch_name, select_backend
from rallypoint.core.plugins import get_plugin_manager
from rallypoint_gloo.availability import check


def test_gloo_is_a_blocking_cpu_backend() -> None:
    record = backends_by_torch_name(get_plugin_manager())["gloo"]
    assert record.name == "gloo"
    assert record.device == "cpu"
    assert record.stream_ordered is False  # the CPU waits for Gloo: the facade times its calls
    assert record.options_model is None
    assert record.priority == 10


def test_gloo_is_available_in_this_torch_build_and_selectable() -> None:
    availability = check()
    assert isinstance(availability, Availability)
    assert availability.available, availability.reason
    selection = select_backend("gloo", plugin_manager=get_plugin_manager())
    assert selection.record.name == "gloo"
    assert selection.reason == f"gloo as configured: {availability.reason}"
