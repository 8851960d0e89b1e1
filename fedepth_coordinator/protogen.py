"""Regenerates the committed gRPC stubs in ``fedepth_coordinator/_proto`` from ``proto/``.

``make proto`` runs ``python -m fedepth_coordinator.protogen``; a test generates into a
temporary directory and compares with the committed files. The proto directory is mapped to the
virtual path ``fedepth_coordinator/_proto`` so the generated modules import each other by their
full package path (``fedepth_coordinator._proto.fedepth.v1``), never as a top-level ``fedepth``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from importlib import resources
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROTO_DIR = REPO / "proto"
PACKAGE_PATH = "fedepth_coordinator/_proto"

log = logging.getLogger(__name__)


def proto_files(proto_dir: Path = PROTO_DIR) -> list[Path]:
    return sorted(proto_dir.rglob("*.proto"))


def generate(out_root: Path, proto_dir: Path = PROTO_DIR) -> list[Path]:
    """Write the stubs under ``out_root/fedepth_coordinator/_proto`` and return their paths."""
    from grpc_tools import protoc

    files = proto_files(proto_dir)
    if not files:
        raise FileNotFoundError(f"no .proto files under {proto_dir}")
    include = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PACKAGE_PATH}={proto_dir}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *map(str, files),
    ]
    out_root.mkdir(parents=True, exist_ok=True)
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {', '.join(map(str, files))}")
    generated = sorted((out_root / PACKAGE_PATH).rglob("*_pb2*.py*"))
    for d in {p.parent for p in generated}:
        node = d
        while node != out_root / "fedepth_coordinator":
            (node / "__init__.py").touch()
            node = node.parent
    return generated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO, help="root to write into (repo root)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for path in generate(args.out):
        log.info("wrote %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
