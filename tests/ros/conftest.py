"""Fixtures for the ROS package tests: synthetic and broken bags, own ROS domain, a listener
node and child-process helpers."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import rclpy
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from rclpy.signals import SignalHandlerOptions
from rosbags.rosbag2 import StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore

from fedepth.data.bag_writer import synthetic_frames, write_rgbd_bag

N_FRAMES = 20
RATE_HZ = 20.0
#: bag_player arguments of a one-shot playback to a node's best-effort subscription: wait for
#: the subscriber, then 1 s more. The player sees the subscription (its writer matched) before
#: the node's reader has matched the writer, and what is sent in between is lost: a fresh CI
#: run lost all 4 frames of a depth node's bag once, and a robot that loses its frames never
#: describes itself, never joins, and the run waits for it until the test times out.
PLAY_AFTER_MATCH = ("--wait-for-subscribers", "1", "--start-delay", "1.0")
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


TIMEOUT = 30.0
#: Topic key suffix: subscribe transient-local (a latched topic such as fedepth/route).
LATCHED = "#latched"


class Listener:
    """A subscriber node in this process, spinning in a thread, recording what arrives."""

    def __init__(
        self, domain_id: int, topics: dict[str, type], sensor_qos: frozenset[str] = frozenset()
    ) -> None:
        self.context = Context()
        rclpy.init(
            args=[],
            context=self.context,
            domain_id=domain_id,
            signal_handler_options=SignalHandlerOptions.NO,
        )
        self.node = rclpy.create_node("listener", context=self.context)
        self.received: dict[str, list[tuple[float, Any]]] = {t: [] for t in topics}
        self.cond = threading.Condition()
        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        latched = QoSProfile(
            depth=10,
            reliability=ReliabilityPolicy.RELIABLE,
            durability=DurabilityPolicy.TRANSIENT_LOCAL,
        )
        self.subscriptions: dict[str, Any] = {}
        for topic, cls in topics.items():
            profile = qos_profile_sensor_data if topic in sensor_qos else qos
            if topic.endswith(LATCHED):
                profile = latched
            self.subscriptions[topic] = self.node.create_subscription(
                cls, topic.split("#")[0], self._callback(topic), profile
            )
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def _callback(self, topic: str) -> Any:
        def on_message(msg: Any) -> None:
            with self.cond:
                self.received[topic].append((time.monotonic(), msg))
                self.cond.notify_all()

        return on_message

    def wait_for(self, counts: dict[str, int], timeout: float = TIMEOUT) -> bool:
        with self.cond:
            return self.cond.wait_for(
                lambda: all(len(self.received[t]) >= n for t, n in counts.items()), timeout
            )

    def wait_for_publishers(self, topics: list[str], timeout: float = TIMEOUT) -> bool:
        """Until each subscription is matched with a publisher (a node started elsewhere)."""
        pause = threading.Event()
        end = time.monotonic() + timeout
        while not all(self.subscriptions[t].get_publisher_count() for t in topics):
            if time.monotonic() > end:
                return False
            pause.wait(0.05)
        return True

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()
        rclpy.shutdown(context=self.context)
        self.thread.join(timeout=5)


@pytest.fixture
def listener_factory(ros_env: dict[str, str]) -> Iterator[Any]:
    made: list[Listener] = []

    def make(topics: dict[str, type], sensor_qos: frozenset[str] = frozenset()) -> Listener:
        made.append(Listener(int(ros_env["ROS_DOMAIN_ID"]), topics, sensor_qos))
        return made[-1]

    yield make
    for listener in made:
        listener.close()


def start_player(args: Sequence[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "fedepth_ros.bag_player", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = TIMEOUT) -> tuple[int, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"bag_player did not finish in {timeout} s:\n{out}{err}")
    return proc.returncode, (out or "") + (err or "")
