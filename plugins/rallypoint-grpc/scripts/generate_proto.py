"""Regenerate the Python modules of the rendezvous service from ``rendezvous.proto``.

Usage: ``python plugins/rallypoint-grpc/scripts/generate_proto.py [--out DIR]`` (needs
grpcio-tools, in the workspace's hatch environment). Without ``--out`` the committed modules in
``src/rallypoint_grpc/_proto`` are rewritten; the test ``test_generated_code_is_fresh`` generates
into a temporary directory and compares.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parents[1] / "src" / "rallypoint_grpc" / "_proto"
PROTO = "rendezvous.proto"


def generate(out: Path) -> list[Path]:
    """Run protoc (grpcio-tools) into ``out``; return the files written, with imports made relative."""
    from grpc_tools import protoc  # type: ignore[import-untyped]

    out.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        str(PROTO_DIR / PROTO),
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {PROTO_DIR / PROTO}")
    grpc_module = out / "rendezvous_pb2_grpc.py"
    # grpcio-tools writes an absolute import; the modules live in a package.
    text = grpc_module.read_text().replace(
        "import rendezvous_pb2 as rendezvous__pb2", "from . import rendezvous_pb2 as rendezvous__pb2"
    )
    grpc_module.write_text(text)
    return sorted(out.glob("rendezvous_pb2*"))


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=PROTO_DIR)
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
