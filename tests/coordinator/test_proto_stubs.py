"""The committed stubs are exactly what `make proto` generates from proto/."""

from __future__ import annotations

from pathlib import Path

from fedepth_coordinator.protogen import PACKAGE_PATH, REPO, generate


def test_regenerating_the_stubs_gives_no_diff(tmp_path: Path) -> None:
    generated = generate(tmp_path)
    assert generated, "protoc produced nothing"
    for path in generated:
        rel = path.relative_to(tmp_path)
        committed = REPO / rel
        assert committed.is_file(), f"{rel} is generated but not committed: run `make proto`"
        assert path.read_bytes() == committed.read_bytes(), f"{rel} is stale: run `make proto`"
    names = {p.name for p in generated}
    committed_stubs = {p.name for p in (REPO / PACKAGE_PATH).rglob("*_pb2*.py*")}
    assert committed_stubs == names, "committed stubs without a .proto: remove them"
