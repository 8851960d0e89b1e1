"""Fixtures for the ROS package tests: small synthetic bags, broken bags, own ROS domain."""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore

from fedepth_ros.bag_writer import synthetic_frames, write_rgbd_bag

N_FRAMES = 20
RATE_HZ = 20.0
_domains = itertools.count()


def ros_domain_id() -> int:
    """A ROS_DOMAIN_ID in 1..100 unique to this process and call (other suites run alongside)."""
    return 1 + (os.getpid() * 13 + next(_domains)) % 100


@pytest.fixture
def ros_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment for rclpy in this process and its children: loopback, own domain."""
    domain = str(ros_domain_id())
    monkeypatch.setenv("ROS_DOMAIN_ID", domain)
    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    monkeypatch.delenv("ROS_STATIC_PEERS", raising=False)
    root = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return dict(os.environ)


@pytest.fixture(scope="session")
def bags(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same synthetic sequence (20 frames at 20 Hz, 64x48) written as mcap and sqlite3."""
    root = tmp_path_factory.mktemp("bags")
    frames = synthetic_frames(N_FRAMES, rate_hz=RATE_HZ)
    return {
        storage: write_rgbd_bag(frames, root / storage, storage=storage, progress=False).path
        for storage in ("mcap", "sqlite3")
    }


def make_empty_bag(path: Path, storage: str = "mcap") -> Path:
    """A valid rosbag2 with an image topic and no messages."""
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    typestore = get_typestore(Stores.ROS2_KILTED)
    with Writer(path, version=9, storage_plugin=plugin) as writer:
        writer.add_connection("/image", "sensor_msgs/msg/Image", typestore=typestore)
    return path


def make_corrupt_bags(source: dict[str, Path], root: Path) -> Iterator[tuple[Path, str]]:
    """(bag, expected error fragment) for several kinds of damage."""
    truncated = root / "truncated_mcap"
    shutil.copytree(source["mcap"], truncated)
    data = next(truncated.glob("*.mcap"))
    data.write_bytes(data.read_bytes()[:3000])
    yield truncated, "cannot open mcap bag"

    bad_db = root / "truncated_sqlite3"
    shutil.copytree(source["sqlite3"], bad_db)
    db = next(bad_db.glob("*.db3"))
    db.write_bytes(db.read_bytes()[:5000])
    yield bad_db, "cannot open sqlite3 bag"

    bad_meta = root / "bad_metadata"
    shutil.copytree(source["mcap"], bad_meta)
    (bad_meta / "metadata.yaml").write_text("rosbag2_bagfile_information: [unclosed\n")
    yield bad_meta, "corrupt metadata.yaml"

    garbage = root / "garbage.mcap"
    garbage.write_bytes(bytes(range(256)) * 8)
    yield garbage, "neither an mcap nor a sqlite3 file"

    no_meta = root / "not_a_bag"
    no_meta.mkdir()
    yield no_meta, "no metadata.yaml"
