"""bag_player as a subprocess: a real rclpy subscriber receives the bag at the recorded rate."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sensor_msgs.msg import CameraInfo, Image

from fedepth.data import rosmsg
from fedepth.data.bag_writer import synthetic_frames

from .conftest import (
    N_FRAMES,
    RATE_HZ,
    TIMEOUT,
    finish,
    make_corrupt_bags,
    make_empty_bag,
    start_player,
)

pytestmark = pytest.mark.ros


@pytest.mark.parametrize(("storage", "rate"), [("mcap", 2.0), ("sqlite3", 1.0)])
def test_player_publishes_the_bag_at_the_recorded_rate(
    bags: dict[str, Path],
    ros_env: dict[str, str],
    listener_factory: Any,
    storage: str,
    rate: float,
) -> None:
    topics = {"/t/image": Image, "/t/depth": Image, "/t/camera_info": CameraInfo}
    listener = listener_factory(topics)
    args = f"--rate {rate} --wait-for-subscribers 1 --ros-args -r __ns:=/t"
    proc = start_player([str(bags[storage]), *args.split()], ros_env)
    got_all = listener.wait_for(dict.fromkeys(topics, N_FRAMES))
    rc, log = finish(proc)
    assert got_all and rc == 0, log
    assert "published 60 messages" in log

    frames = synthetic_frames(N_FRAMES, rate_hz=RATE_HZ)
    expected = [f.stamp_ns for f in frames]
    for topic, received in listener.received.items():
        msgs = [m for _, m in received]
        assert len(msgs) == N_FRAMES, topic
        assert [rosmsg.stamp_to_ns(m.header.stamp) for m in msgs] == expected, topic
    images = [m for _, m in listener.received["/t/image"]]
    assert {m.encoding for m in images} == {"rgb8"}
    np.testing.assert_array_equal(rosmsg.image_to_rgb(images[3]), frames[3].rgb)
    depths = [m for _, m in listener.received["/t/depth"]]
    assert {m.encoding for m in depths} == {"32FC1"}
    np.testing.assert_array_equal(rosmsg.depth_to_meters(depths[5]), frames[5].depth)
    info = listener.received["/t/camera_info"][0][1]
    np.testing.assert_array_equal(rosmsg.k_from_camera_info(info), frames[0].K)

    arrivals = [t for t, _ in listener.received["/t/image"]]
    span = arrivals[-1] - arrivals[0]
    want = (N_FRAMES - 1) / RATE_HZ / rate
    print(f"{storage} rate {rate}: image span {span:.3f} s, recorded/rate {want:.3f} s")
    assert span == pytest.approx(want, rel=0.2, abs=0.05)


def test_player_topic_selection_offset_prefix_remap_and_loop(
    bags: dict[str, Path], ros_env: dict[str, str], listener_factory: Any
) -> None:
    topics = {"/t/cam/image": Image, "/t/info": CameraInfo, "/t/cam/depth": Image}
    # second subscriptions with the sensor-data QoS (best effort) that robot nodes use; the
    # player waits for both subscriptions of each played topic
    topics.update({"/t/cam/image#sensor": Image, "/t/info#sensor": CameraInfo})
    listener = listener_factory(topics, frozenset({"/t/cam/image#sensor", "/t/info#sensor"}))
    args = (
        "--topics /image,camera_info --start-offset 0.5 --prefix cam --rate 4 --loop"
        " --wait-for-subscribers 2 --ros-args -r __ns:=/t -r cam/camera_info:=info"
    )
    proc = start_player([str(bags["mcap"]), *args.split()], ros_env)
    looped = listener.wait_for({"/t/cam/image": 15, "/t/info": 15})
    proc.send_signal(signal.SIGINT)
    rc, log = finish(proc)
    assert looped and rc == 0, log
    first = synthetic_frames(1, rate_hz=RATE_HZ)[0].stamp_ns
    period = round(1e9 / RATE_HZ)
    frames = [
        (rosmsg.stamp_to_ns(m.header.stamp) - first) // period
        for _, m in listener.received["/t/cam/image"][:15]
    ]
    assert frames == list(range(10, 20)) + list(range(10, 15))  # offset 0.5 s = frame 10
    assert listener.received["/t/cam/depth"] == []  # not selected
    assert listener.received["/t/cam/image#sensor"] and listener.received["/t/info#sensor"]


def _run_failing(args: Sequence[str], env: dict[str, str]) -> str:
    rc, log = finish(start_player(args, env))
    assert rc == 1, log
    assert "Traceback" not in log
    return log


def test_player_fails_clearly_on_corrupt_bags(
    bags: dict[str, Path], ros_env: dict[str, str], tmp_path: Path
) -> None:
    bag, fragment = next(make_corrupt_bags(bags, tmp_path))
    log = _run_failing([str(bag)], ros_env)
    assert f"bag {bag}: {fragment}" in log


def test_player_fails_clearly_on_empty_bag(ros_env: dict[str, str], tmp_path: Path) -> None:
    bag = make_empty_bag(tmp_path / "empty", "sqlite3")
    assert f"bag {bag}: contains no messages" in _run_failing([str(bag)], ros_env)


def test_player_fails_clearly_on_missing_topic(
    bags: dict[str, Path], ros_env: dict[str, str]
) -> None:
    bag = bags["mcap"]
    log = _run_failing([str(bag), "--topics", "/image,/lidar"], ros_env)
    assert f"bag {bag}: no topic /lidar (its topics: /camera_info, /depth, /image)" in log


def test_player_help_and_parameters_file(bags: dict[str, Path], ros_env: dict[str, str]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fedepth_ros.bag_player", "--help"],
        env=ros_env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    ).stdout
    assert "--rate" in out and "start_offset" in out
    root = Path(__file__).resolve().parents[2]
    params = root / "config" / "bag_player.yaml"
    args = f"--ros-args --params-file {params} -p bag:={bags['mcap']} -p rate:=50.0"
    rc, log = finish(start_player(args.split(), ros_env))
    assert rc == 0 and "published 60 messages" in log, log


_FROZEN_READER = """
import time, rclpy
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CameraInfo, Image
rclpy.init()
node = rclpy.create_node("reader")
qos = QoSProfile(
    history=HistoryPolicy.KEEP_ALL, depth=1000, reliability=ReliabilityPolicy.RELIABLE
)
subs = [
    node.create_subscription(cls, topic, lambda m: None, qos)
    for topic, cls in (("/t/image", Image), ("/t/depth", Image), ("/t/camera_info", CameraInfo))
]
while not all(s.get_publisher_count() for s in subs):
    rclpy.spin_once(node, timeout_sec=0.05)
end = time.monotonic() + 1.0  # the player's side of discovery: it then plays for 5 s
while time.monotonic() < end:
    rclpy.spin_once(node, timeout_sec=0.05)
print("matched", flush=True)
rclpy.spin(node)
"""


def test_a_lossless_player_whose_subscriber_never_acknowledges_exits_3(
    bags: dict[str, Path], ros_env: dict[str, str]
) -> None:
    """The loss-free promise broken (a matched reliable reader that stops acknowledging: here
    a process frozen with SIGSTOP) is an exit status, not only a warning: fedepth fleet
    replay restarts the robot whose frames never arrived instead of waiting for it forever."""
    reader = subprocess.Popen(
        [sys.executable, "-c", _FROZEN_READER], env=ros_env, stdout=subprocess.PIPE, text=True
    )
    try:
        # 1 s of bag played in 5 s; the reader freezes as soon as it sees the player
        args = "--lossless --wait-for-subscribers 1 --rate 0.2 --ros-args -r __ns:=/t"
        player = start_player(
            [str(bags["mcap"]), *args.split(), "-p", "ack_timeout:=2.0"], ros_env
        )
        assert reader.stdout is not None and reader.stdout.readline().strip() == "matched"
        reader.send_signal(signal.SIGSTOP)
        rc, log = finish(player)
    finally:
        reader.kill()
        reader.wait()
    assert rc == 3, log
    assert "not every message was acknowledged within 2 s" in log


def test_the_spin_thread_treats_a_shutdown_while_building_its_wait_set_as_a_stop() -> None:
    """A Ctrl-C shuts the context down from the signal handler; when that lands while the
    executor builds its wait set, rclpy raises RCLError ('the given context is not valid')
    instead of ExternalShutdownException (seen as a traceback in a fleet's terminal). The
    executor here hits that window every time; an error with the context alive propagates."""
    import threading

    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy

    from fedepth_ros.bag_player import _spin

    class RacingExecutor(SingleThreadedExecutor):
        def __init__(self, context: rclpy.Context, *, shut_down: bool) -> None:
            super().__init__(context=context)
            self.shut_down = shut_down

        def spin(self) -> None:
            if self.shut_down:
                rclpy.shutdown(context=self.context)  # the signal, during the wait-set build
            raise _rclpy.RCLError("failed to initialize wait set: the given context is not valid")

    for shut_down in (True, False):
        context = rclpy.Context()
        rclpy.init(context=context, domain_id=0)
        executor = RacingExecutor(context, shut_down=shut_down)
        stop = threading.Event()
        try:
            if shut_down:
                _spin(executor, stop)  # no traceback: a stop
            else:
                with pytest.raises(_rclpy.RCLError):
                    _spin(executor, stop)  # a real error while the context is alive
        finally:
            rclpy.try_shutdown(context=context)
        assert stop.is_set()
