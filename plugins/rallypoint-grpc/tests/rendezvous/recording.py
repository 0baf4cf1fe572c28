"""A gRPC rendezvous client that records the calls it makes (tests of how many requests a step costs)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rallypoint_grpc.rendezvous.backend import GrpcBackend


class RecordingBackend(GrpcBackend):
    """The real client, recording the methods it calls, in order (a watch stream as ``"Watch"``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []

    def _invoke(self, op: str, request: Any) -> Any:
        self.calls.append(op)
        return super()._invoke(op, request)

    def _watch(self, make: Any, timeout: float) -> Any:
        self.calls.append("Watch")
        return super()._watch(make, timeout)

    def counts(self) -> dict[str, int]:
        """How many calls of each method."""
        return dict(Counter(self.calls))
