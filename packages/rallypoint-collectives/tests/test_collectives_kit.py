"""The collective-backend conformance kit: Gloo passes it, and a backend that misbehaves fails it."""

from __future__ import annotations

import pytest

from rallypoint.collectives.records import Availability, CollectiveBackendRecord
from rallypoint.collectives.testing import CollectiveBackendConformance


class TestGloo(CollectiveBackendConformance):
    @pytest.fixture
    def backend_name(self) -> str:
        return "gloo"


def never_available() -> Availability:
    return Availability(False, "the test says so")


KIT = CollectiveBackendConformance()


def test_a_cpu_backend_that_says_it_is_unavailable_fails() -> None:
    record = CollectiveBackendRecord(
        name="nope", summary="never", torch_backend="gloo", availability=f"{__name__}:never_available"
    )

    with pytest.raises(pytest.fail.Exception, match="nope says it is unavailable on CPU: the test says so"):
        KIT.test_collectives_across_processes(record, "nope", None)


def test_a_gpu_backend_without_a_gpu_is_skipped_with_the_reason() -> None:
    record = CollectiveBackendRecord(
        name="gpu-only", summary="x", torch_backend="nccl", device="cuda", availability=f"{__name__}:never_available"
    )

    with pytest.raises(pytest.skip.Exception, match="gpu-only needs a GPU: the test says so"):
        KIT.test_collectives_across_processes(record, "gpu-only", None)


def test_a_record_without_a_summary_or_with_a_bad_timeout_fails() -> None:
    with pytest.raises(AssertionError, match="summary"):
        KIT.test_the_record_is_well_formed(CollectiveBackendRecord(name="bare", torch_backend="gloo"))
    with pytest.raises(AssertionError):
        KIT.test_the_record_is_well_formed(
            CollectiveBackendRecord(name="slow", summary="s", torch_backend="gloo", default_timeout=-1.0)
        )


def test_options_without_a_model_fail() -> None:
    record = CollectiveBackendRecord(name="plain", summary="p", torch_backend="gloo")

    with pytest.raises(AssertionError, match="no options_model"):
        KIT.test_options_validate(record, {"announce": True})
