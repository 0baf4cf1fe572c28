"""The agent's debug service: which requests it answers."""

from __future__ import annotations

import threading
import time
from typing import Any

from rallypoint.agent.debug_service import DEBUG_REQUEST_KEY, DebugService, gather, request
from rallypoint.rendezvous.backend import Entry
from rallypoint.rendezvous.memory import MemoryBackend


class LateFirstRead(MemoryBackend):
    """A key space whose first read of the debug request waits for ``go`` (a thread scheduled late)."""

    def __init__(self) -> None:
        super().__init__("debug-service", shared=False)
        self.go = threading.Event()
        self.waited = False

    def get(self, key: str) -> Entry | None:
        if key == DEBUG_REQUEST_KEY and not self.waited:
            self.waited = True
            assert self.go.wait(10)
        return super().get(key)


def test_a_request_made_after_start_is_answered_even_before_the_first_read() -> None:
    backend = LateFirstRead()
    service = DebugService(backend, "node0", "host0")
    service.start()
    try:
        rid = request(backend, "tester")  # the service's thread has not read the key space yet
        backend.go.set()
        answers, missing = gather(backend, rid, timeout=5, expect={"node0"})
    finally:
        service.stop()
    assert missing == []
    assert [a["node"] for a in answers] == ["node0"]


def test_a_request_made_before_start_is_not_answered() -> None:
    backend = MemoryBackend("debug-service-old", shared=False)
    old = request(backend, "a tool that ran before this agent")
    time.sleep(0.01)
    service = DebugService(backend, "node0", "host0")
    service.start()
    try:
        answers, missing = gather(backend, old, timeout=1.5, expect={"node0"})
        assert (answers, missing) == ([], ["node0"])
        new = request(backend, "tester")
        answers, missing = gather(backend, new, timeout=5, expect={"node0"})
    finally:
        service.stop()
    assert missing == []
    assert [a["node"] for a in answers] == ["node0"]


def test_an_undated_request_found_at_start_counts_as_old() -> None:
    backend = MemoryBackend("debug-service-undated", shared=False)
    value: dict[str, Any] = {"id": "abc", "by": "an older rallypoint"}
    backend.set(DEBUG_REQUEST_KEY, value)
    service = DebugService(backend, "node0", "host0")
    service.start()
    try:
        answers, missing = gather(backend, "abc", timeout=1.5, expect={"node0"})
    finally:
        service.stop()
    assert (answers, missing) == ([], ["node0"])
