"""robot_node and depth_node as subprocesses on a replayed test-scene bag (no coordinator)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from sensor_msgs.msg import CameraInfo, Image, PointCloud2
from std_msgs.msg import String

from fedepth.data import rosmsg
from fedepth.data.bag_writer import synthetic_frames, write_rgbd_bag
from fedepth.models import create_model, save_weights

from .conftest import N_FRAMES, PLAY_AFTER_MATCH, RATE_HZ, TIMEOUT, finish, start_player

pytestmark = pytest.mark.ros


def start_node(module: str, ns: str, params: dict[str, Any], env: dict[str, str]) -> Any:
    argv = [sys.executable, "-m", f"fedepth_ros.{module}", "--ros-args", "-r", f"__ns:=/{ns}"]
    for name, value in params.items():
        argv += ["-p", f"{name}:={value}"]
    return subprocess.Popen(
        argv,
        env={**env, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    return finish(proc)


def test_depth_node_with_a_local_model_publishes_depth_for_every_frame_its_border_masked(
    bags: dict[str, Path], ros_env: dict[str, str], listener_factory: Any, tmp_path: Path
) -> None:
    weights = tmp_path / "model.safetensors"
    save_weights(create_model("regression-lite", min_depth=0.1, max_depth=10.0), weights)
    topics = {
        "/d/depth_pred/image": Image,
        "/d/depth_pred/camera_info": CameraInfo,
        "/d/depth_pred/points": PointCloud2,
        "/d/fedepth/route#latched": String,
    }
    listener = listener_factory(topics)
    params = {
        "coordinator": '""',
        "weights": weights,  # its card (regression-lite, 0.1-10 m) makes the model
        "device": "cpu",
        "queue_size": N_FRAMES,
        "output_qos": "reliable",  # the listener counts every frame
        "publish_points": "true",
        # top, bottom, left, right of 48 x 64: 6, 5 and 3 pixels (4.8 and 3.2 rounded), none
        "mask_border": "[0.125, 0.1, 0.05, 0.0]",
    }
    node = start_node("depth_node", "d", params, ros_env)
    # depth_pred is volatile: play only once this listener is matched with the node
    assert listener.wait_for_publishers(
        ["/d/depth_pred/image", "/d/depth_pred/camera_info", "/d/depth_pred/points"],
        timeout=6 * TIMEOUT,  # the node imports torch and builds its model first
    ), node.poll()
    player = start_player(
        [
            str(bags["mcap"]),
            "--topics",
            "/image,/camera_info",
            *PLAY_AFTER_MATCH,
            "--wait-timeout",
            str(TIMEOUT),
            "--ros-args",
            "-r",
            "__ns:=/d",
        ],
        ros_env,
    )
    got_all = listener.wait_for(
        {"/d/depth_pred/image": N_FRAMES, "/d/depth_pred/points": N_FRAMES,
         "/d/fedepth/route#latched": 1}
    )  # fmt: skip
    rc_player, player_log = finish(player)
    rc, log = stop(node)
    counts = {t: len(m) for t, m in listener.received.items()}
    assert got_all and rc_player == 0 and rc == 0, f"{counts}\n{log}{player_log}"
    assert "Traceback" not in log

    frames = synthetic_frames(N_FRAMES, rate_hz=RATE_HZ)
    preds = [m for _, m in listener.received["/d/depth_pred/image"]]
    assert [rosmsg.stamp_to_ns(m.header.stamp) for m in preds] == [f.stamp_ns for f in frames]
    inside = np.zeros(frames[0].depth.shape, bool)
    inside[6:-5, 3:] = True
    for msg in preds:
        depth = rosmsg.image_to_numpy(msg)
        assert msg.encoding == "32FC1" and depth.shape == frames[0].depth.shape
        assert np.isfinite(depth[inside]).all() and np.isnan(depth[~inside]).all()
        assert depth[inside].min() >= 0.1 and depth[inside].max() <= 10.0
    info = listener.received["/d/depth_pred/camera_info"][0][1]
    np.testing.assert_array_equal(rosmsg.k_from_camera_info(info), frames[0].K)
    assert info.header == preds[0].header  # the sibling camera_info carries the image header

    # the point cloud against one computed here from the published depth and camera_info
    cloud = listener.received["/d/depth_pred/points"][0][1]
    assert [f.name for f in cloud.fields] == ["x", "y", "z"] and cloud.point_step == 12
    assert cloud.header == preds[0].header
    xyz = np.frombuffer(bytes(cloud.data), dtype="<f4").reshape(cloud.height, cloud.width, 3)
    depth = rosmsg.image_to_numpy(preds[0]).astype(np.float64)
    K = np.asarray(info.k, dtype=np.float64).reshape(3, 3)
    v, u = np.indices(depth.shape)
    rays = np.linalg.inv(K) @ np.stack([u.ravel(), v.ravel(), np.ones(u.size)])
    expected = (rays * depth.ravel()).T.reshape(*depth.shape, 3)
    np.testing.assert_allclose(xyz, expected, rtol=1e-5, atol=1e-5)
    route = json.loads(listener.received["/d/fedepth/route#latched"][0][1].data)
    assert route["source"] == "local" and route["weights_file"] == str(weights)


def test_depth_node_defaults_deliver_640x480_depth_to_a_sensor_data_subscriber(
    ros_env: dict[str, str], listener_factory: Any, tmp_path: Path
) -> None:
    """1.2 MB best-effort samples: with Fast DDS's built-in 512 KiB shared-memory segment not
    one reached a subscriber in another process; the nodes' large-data profile carries them."""
    weights = tmp_path / "model.safetensors"
    save_weights(create_model("regression-lite", min_depth=0.1, max_depth=10.0), weights)
    frames = synthetic_frames(4, width=640, height=480, rate_hz=2.0)
    bag = write_rgbd_bag(frames, tmp_path / "vga", progress=False).path
    topic = "/vga/depth_pred/image"
    listener = listener_factory({topic: Image}, sensor_qos=frozenset({topic}))
    # the defaults, but for the weights and no coordinator to wait for
    node = start_node("depth_node", "vga", {"coordinator": '""', "weights": weights}, ros_env)
    assert listener.wait_for_publishers([topic], timeout=6 * TIMEOUT), node.poll()
    play = [str(bag), "--topics", "/image,/camera_info", *PLAY_AFTER_MATCH]
    play += ["--wait-timeout", str(TIMEOUT), "--ros-args", "-r", "__ns:=/vga"]
    player = start_player(play, ros_env)
    got_all = listener.wait_for({topic: len(frames)})
    rc_player, player_log = finish(player)
    rc, log = stop(node)
    counts = len(listener.received[topic])
    assert got_all and rc_player == 0 and rc == 0, f"{counts}\n{log}{player_log}"
    shapes = {rosmsg.image_to_numpy(m).shape for _, m in listener.received[topic]}
    assert shapes == {(480, 640)}


def test_robot_node_buffers_pairs_and_reports_status_and_diagnostics(
    bags: dict[str, Path], ros_env: dict[str, str], listener_factory: Any, tmp_path: Path
) -> None:
    topics = {"/r/fedepth/status": String, "/diagnostics": DiagnosticArray}
    listener = listener_factory(topics)
    params = {
        "robot_id": "robot-x",
        "coordinator": "127.0.0.1:9",  # never reached: the descriptor needs more frames
        "descriptor_frames": 1000,
        "buffer_size": 4,
        "frame_stride": 2,
        "spill_dir": tmp_path / "spill",
        "spill_size": 3,
        "status_period": 0.2,
        "device": "cpu",
    }
    node = start_node("robot_node", "r", params, ros_env)
    player = start_player(
        [
            str(bags["sqlite3"]),
            "--loop",  # stamps start over each loop: the node must keep pairing
            "--rate",
            "4",
            "--wait-for-subscribers",
            "1",
            "--wait-timeout",
            str(TIMEOUT),
            "--ros-args",
            "-r",
            "__ns:=/r",
        ],
        ros_env,
    )

    def last_status() -> dict[str, Any]:
        with listener.cond:
            msgs = listener.received["/r/fedepth/status"]
            return json.loads(msgs[-1][1].data) if msgs else {}

    with listener.cond:
        assert listener.cond.wait_for(
            lambda: last_status().get("pairs", 0) >= N_FRAMES + 10, TIMEOUT
        ), last_status()
    rc_player, player_log = stop(player)
    assert rc_player == 0, player_log
    status = last_status()
    rc, log = stop(node)
    assert rc == 0 and "Traceback" not in log, log
    assert "time jumped back" in log and "resetting the image/depth synchronizer" in log
    # every frame pairs (equal stamps), across bag loops; 4 kept in memory, 3 spilled
    buffer = status["buffer"]
    assert status["robot_id"] == "robot-x" and status["phase"] == "buffering"
    # every second pair is kept (the status is a snapshot taken while frames arrive: +-1)
    assert buffer["capacity"] == 7 and abs(buffer["kept"] - (status["pairs"] + 1) // 2) <= 1
    # evicted frames reach the disk in the background: the snapshot may miss one being written
    assert min(4, buffer["kept"]) <= buffer["size"] <= min(7, buffer["kept"])
    assert status["error"] is None
    assert len(list((tmp_path / "spill").glob("*.npz"))) == min(3, max(0, buffer["kept"] - 4))
    diags = [
        s
        for _, m in listener.received["/diagnostics"]
        for s in m.status
        if s.hardware_id == "robot-x"
    ]
    assert diags and diags[-1].level == DiagnosticStatus.OK
    assert {kv.key for kv in diags[-1].values} >= {"phase", "round", "buffer.fill"}


@pytest.mark.parametrize(
    ("module", "params", "message"),
    [
        ("depth_node", {"coordinator": '""'}, "set coordinator (to route a model) or weights"),
        ("robot_node", {"buffer_size": 0}, "buffer_size must be >= 1, got 0"),
        ("robot_node", {"coordinator": "nohost"}, "coordinator must be host:port, got 'nohost'"),
        ("depth_node", {"weights": "/nonexistent.safetensors"}, "/nonexistent.safetensors"),
        (
            "depth_node",
            {"mask_border": "[0.5, 0.0, 0.0, 0.0]"},
            "mask_border: top must be in [0, 0.5), got 0.5",
        ),
        (
            "depth_node",
            {"mask_border": "0.1"},
            "mask_border must be written like its default, [0.0, 0.0, 0.0, 0.0] (",
        ),
        ("robot_node", {"local_steps": "2.5"}, "local_steps must be written like its default, "),
        # what `-p coordinator:=""` becomes once a shell has eaten the quotes
        ("depth_node", {"coordinator": ""}, "the shell removed the quotes"),
        (
            "depth_node",
            {"output_qos": "fast"},
            "output_qos must be one of sensor_data, reliable, lossless",
        ),
    ],
)
def test_nodes_reject_unusable_parameters_in_one_line(
    ros_env: dict[str, str], module: str, params: dict[str, Any], message: str
) -> None:
    rc, log = finish(start_node(module, "bad", params, ros_env))
    assert rc == 1 and message in log and "Traceback" not in log, log
