"""The committed protobuf/gRPC modules match rendezvous.proto (regenerate with the script otherwise)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

PLUGIN = Path(__file__).resolve().parents[1]
SCRIPT = PLUGIN / "scripts" / "generate_proto.py"
COMMITTED = PLUGIN / "src" / "rallypoint_grpc" / "_proto"


def _generator() -> object:
    spec = importlib.util.spec_from_file_location("generate_proto", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["generate_proto"] = module
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    generated = _generator().generate(tmp_path)  # type: ignore[attr-defined]
    names = sorted(p.name for p in generated)
    assert names == ["rendezvous_pb2.py", "rendezvous_pb2.pyi", "rendezvous_pb2_grpc.py"]
    stale = [n for n in names if (COMMITTED / n).read_text() != (tmp_path / n).read_text()]
    assert not stale, f"{stale} differ from rendezvous.proto: run python {SCRIPT.relative_to(PLUGIN.parents[1])}"


def test_the_proto_has_no_pickle_and_streams_watches() -> None:
    proto = (COMMITTED / "rendezvous.proto").read_text()
    assert "rpc Watch(WatchRequest) returns (stream WatchEvent);" in proto
    assert "bytes" not in proto.split("syntax")[1]  # values are JSON text, never opaque blobs
