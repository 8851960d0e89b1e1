"""bag_writer output read back with rosbags, the mcap library and rclpy; bag inspection errors."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from mcap.reader import make_reader
from rosbags.rosbag2 import Reader
from rosbags.typesys import Stores, get_typestore

from fedepth.data import rosmsg
from fedepth.data.bag_writer import BagTopics, BagWriteError, synthetic_frames, write_rgbd_bag
from fedepth.data.bags import BagError, bag_info, open_bag, select_connections
from fedepth.data.frames import RGBDFrame

from .conftest import N_FRAMES, RATE_HZ, make_corrupt_bags, make_empty_bag

TOPICS = {"/image", "/depth", "/camera_info"}


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_written_bag_reads_back_with_rosbags(bags: dict[str, Path], storage: str) -> None:
    frames = synthetic_frames(N_FRAMES, rate_hz=RATE_HZ)
    typestore = get_typestore(Stores.ROS2_KILTED)
    seen: Counter[str] = Counter()
    with Reader(bags[storage]) as reader:
        assert {c.topic for c in reader.connections} == TOPICS
        for conn, log_ns, raw in reader.messages():
            msg = typestore.deserialize_cdr(raw, conn.msgtype)
            frame = frames[seen[conn.topic]]
            seen[conn.topic] += 1
            assert log_ns == frame.stamp_ns == rosmsg.stamp_to_ns(msg.header.stamp)
            assert msg.header.frame_id == "camera"
            if conn.topic == "/image":
                assert (msg.encoding, msg.step) == ("rgb8", 64 * 3)
                np.testing.assert_array_equal(rosmsg.image_to_rgb(msg), frame.rgb)
            elif conn.topic == "/depth":
                assert msg.encoding == "32FC1"
                raw_depth = rosmsg.image_to_numpy(msg)
                invalid = frame.depth == 0
                assert invalid.any() and np.isnan(raw_depth[invalid]).all()
                np.testing.assert_array_equal(rosmsg.depth_to_meters(msg), frame.depth)
            else:
                assert conn.msgtype == "sensor_msgs/msg/CameraInfo"
                np.testing.assert_array_equal(rosmsg.k_from_camera_info(msg), frame.K)
                assert (msg.width, msg.height) == (64, 48)
    assert seen == dict.fromkeys(TOPICS, N_FRAMES)


def test_written_mcap_opens_with_the_mcap_library(bags: dict[str, Path]) -> None:
    (path,) = bags["mcap"].glob("*.mcap")
    with path.open("rb") as f:
        reader = make_reader(f)
        summary = reader.get_summary()
        assert summary is not None
        channels = {c.topic: c for c in summary.channels.values()}
        assert set(channels) == TOPICS
        for channel in channels.values():
            schema = summary.schemas[channel.schema_id]
            assert channel.message_encoding == "cdr" and schema.encoding == "ros2msg"
            assert schema.name in ("sensor_msgs/msg/Image", "sensor_msgs/msg/CameraInfo")
            assert b"Header header" in schema.data  # full definition, usable by Foxglove
        counts = {channels[t].id: 0 for t in TOPICS}
        stamps = []
        for _schema, channel, message in reader.iter_messages():
            counts[channel.id] += 1
            stamps.append(message.log_time)
        assert set(counts.values()) == {N_FRAMES}
        assert stamps == sorted(stamps)
        assert summary.statistics is not None and summary.statistics.message_count == 60


def test_written_messages_deserialize_as_rclpy_messages(bags: dict[str, Path]) -> None:
    from rclpy.serialization import deserialize_message
    from sensor_msgs.msg import CameraInfo, Image

    with open_bag(bags["sqlite3"]) as reader:
        for conn, _, raw in reader.messages():
            cls = CameraInfo if conn.topic == "/camera_info" else Image
            msg = deserialize_message(raw, cls)
            assert msg.header.frame_id == "camera"
            if conn.topic == "/depth":
                assert rosmsg.depth_to_meters(msg).shape == (48, 64)


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_bag_info(bags: dict[str, Path], storage: str) -> None:
    info = bag_info(bags[storage])
    assert info.storage == storage and info.message_count == 3 * N_FRAMES
    assert {(t.name, t.count) for t in info.topics} == {(t, N_FRAMES) for t in TOPICS}
    assert info.duration_ns == round((N_FRAMES - 1) * 1e9 / RATE_HZ)
    assert info.to_dict()["duration_s"] == pytest.approx((N_FRAMES - 1) / RATE_HZ)


def test_single_storage_file_is_a_bag(bags: dict[str, Path]) -> None:
    (path,) = bags["mcap"].glob("*.mcap")
    assert bag_info(path).message_count == 3 * N_FRAMES


def test_writer_options(tmp_path: Path) -> None:
    frames = synthetic_frames(3)
    out = write_rgbd_bag(
        frames,
        tmp_path / "b",
        topics=BagTopics(image="/cam/rgb", depth="/cam/depth", camera_info="/cam/info"),
        depth_encoding="16UC1",
        frame_id="optical",
        custom_data={"fedepth.platform": "car"},
        progress=False,
    )
    assert (out.frames, out.start_ns, out.end_ns) == (3, frames[0].stamp_ns, frames[2].stamp_ns)
    typestore = get_typestore(Stores.ROS2_KILTED)
    with Reader(out.path) as reader:
        assert {c.topic for c in reader.connections} == {"/cam/rgb", "/cam/depth", "/cam/info"}
        (conn,) = [c for c in reader.connections if c.topic == "/cam/depth"]
        _, _, raw = next(reader.messages([conn]))
        msg = typestore.deserialize_cdr(raw, conn.msgtype)
        assert (msg.encoding, msg.header.frame_id) == ("16UC1", "optical")
        np.testing.assert_allclose(rosmsg.depth_to_meters(msg), frames[0].depth, atol=5e-4)
    assert "fedepth.platform: car" in (out.path / "metadata.yaml").read_text()


def _frame(stamp: int, *, rgb_shape: tuple[int, ...] = (4, 4, 3)) -> RGBDFrame:
    return RGBDFrame(
        rgb=np.zeros(rgb_shape, np.uint8),
        depth=np.ones((4, 4), np.float32),
        K=np.diag([2.0, 2.0, 1.0]),
        stamp_ns=stamp,
    )


@pytest.mark.parametrize(
    ("frames", "match"),
    [
        ([_frame(5), _frame(5)], "frame 1: stamp 5 ns does not increase"),
        ([_frame(5), _frame(6, rgb_shape=(4, 4))], r"frame 1: rgb must be \(H, W, 3\) uint8"),
        ([], "no frames"),
        (
            [
                RGBDFrame(
                    np.zeros((4, 4, 3), np.uint8), np.ones((4, 4), np.float32), np.eye(3) * 0, 1
                )
            ],
            "frame 0: K has non-positive focal lengths",
        ),
    ],
)
def test_writer_rejects_bad_frames_and_cleans_up(
    tmp_path: Path, frames: list[RGBDFrame], match: str
) -> None:
    with pytest.raises(BagWriteError, match=match):
        write_rgbd_bag(frames, tmp_path / "b", progress=False)
    assert not (tmp_path / "b").exists()


def test_writer_refuses_to_overwrite_and_unknown_storage(tmp_path: Path) -> None:
    with pytest.raises(BagWriteError, match="exists already"):
        write_rgbd_bag([_frame(1)], tmp_path, progress=False)
    with pytest.raises(BagWriteError, match="storage must be one of"):
        write_rgbd_bag([_frame(1)], tmp_path / "x", storage="rosbag1", progress=False)


def test_corrupt_bags_fail_clearly(bags: dict[str, Path], tmp_path: Path) -> None:
    for bag, fragment in make_corrupt_bags(bags, tmp_path):
        with pytest.raises(BagError, match=fragment) as err:
            bag_info(bag)
        assert str(bag) in str(err.value)
    with pytest.raises(BagError, match="no such file or directory"):
        bag_info(tmp_path / "missing")


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_empty_bag_has_info_but_nothing_to_play(tmp_path: Path, storage: str) -> None:
    bag = make_empty_bag(tmp_path / "empty", storage)
    info = bag_info(bag)
    assert info.message_count == 0 and [t.count for t in info.topics] == [0]
    with open_bag(bag) as reader, pytest.raises(BagError, match="contains no messages"):
        select_connections(reader, bag)


def test_missing_topic_names_the_topics_that_exist(bags: dict[str, Path]) -> None:
    with open_bag(bags["mcap"]) as reader:
        with pytest.raises(BagError, match=r"no topic /lidar \(its topics: /camera_info,"):
            select_connections(reader, bags["mcap"], ["/image", "lidar"])
        assert [c.topic for c in select_connections(reader, bags["mcap"], ["image"])] == ["/image"]
