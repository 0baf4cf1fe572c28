"""The file backend against the conformance kit."""

from __future__ import annotations

from pathlib import Path

import pytest

from rallypoint.rendezvous.testing import MultiProcessBackendConformance, MultiProcessHandlerConformance
from rallypoint_file.backend import FileBackend


class FileFactory:
    """Picklable: child processes open their own client of the same directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __call__(self, run_id: str) -> FileBackend:
        return FileBackend(self.root, run_id, poll_interval=0.005)


class TestFileBackend(MultiProcessBackendConformance):
    @pytest.fixture
    def backend_factory(self, tmp_path: Path) -> FileFactory:
        return FileFactory(tmp_path)


class TestFileHandler(MultiProcessHandlerConformance):
    @pytest.fixture
    def backend_factory(self, tmp_path: Path) -> FileFactory:
        return FileFactory(tmp_path)
