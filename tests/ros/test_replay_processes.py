"""The replay's forked nodes (fedepth_ros.replay.processes.NodeForkServer): a forked node is a
process of its own with the environment, log and exit status the driver gave it, as a fresh
interpreter's would be."""

from __future__ import annotations

import multiprocessing.forkserver
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sensor_msgs.msg import CameraInfo, Image

from fedepth.data import rosmsg
from fedepth.data.bag_writer import synthetic_frames
from fedepth_ros.replay.processes import Child, NodeForkServer, node_cmd, ros_params
from fedepth_ros.replay.training import failed_process

from .conftest import N_FRAMES, RATE_HZ, TIMEOUT, Listener, ros_domain_id

pytestmark = pytest.mark.ros


@pytest.fixture(scope="module")
def forks() -> Iterator[NodeForkServer]:
    server = NodeForkServer(preload=("fedepth_ros.bag_player",))
    yield server
    server.close()


def _player(bag: Path, ns: str, **params: Any) -> list[str]:
    ros = ["--ros-args", "-r", f"__ns:={ns}", *ros_params({"bag": str(bag), **params})]
    return [*node_cmd("bag_player"), *ros]


def _waiting_player(
    bags: dict[str, Path], tmp_path: Path, env: dict[str, str], forks: NodeForkServer
) -> Child:
    """A forked player that waits for a subscriber no one starts (logs to ``w.log``)."""
    cmd = _player(bags["mcap"], "/nobody", wait_for_subscribers=1)
    return Child("w", cmd, tmp_path / "w.log", env, forks)


def test_a_forked_node_fails_with_its_own_status_and_log(
    forks: NodeForkServer, bags: dict[str, Path], ros_env: dict[str, str], tmp_path: Path
) -> None:
    log = tmp_path / "player.log"
    child = Child("p", _player(bags["mcap"], "/t", topics="/image,/lidar"), log, ros_env, forks)
    assert child.proc.wait(TIMEOUT) == 1
    assert child.proc.pid != os.getpid()
    assert "no topic /lidar" in log.read_text(encoding="utf-8")


def test_closing_stops_the_fork_server_and_its_nodes_and_a_start_opens_a_new_one(
    forks: NodeForkServer, bags: dict[str, Path], ros_env: dict[str, str], tmp_path: Path
) -> None:
    waiting = _waiting_player(bags, tmp_path, ros_env, forks)
    server = multiprocessing.forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
    assert server is not None and waiting.alive()
    forks.close()
    assert not waiting.alive()
    with pytest.raises(ProcessLookupError):
        os.kill(server, 0)  # exited and reaped
    failing = _player(bags["mcap"], "/t", topics="/lidar")
    assert Child("f", failing, tmp_path / "f.log", ros_env, forks).proc.wait(TIMEOUT) == 1


def test_a_forked_player_plays_in_the_domain_it_is_given_and_stops_on_sigint(
    forks: NodeForkServer,
    bags: dict[str, Path],
    ros_env: dict[str, str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    # the fork server runs already, started with another domain in its environment
    Child("p0", _player(bags["mcap"], "/u", topics="/x"), tmp_path / "p0.log", ros_env, forks)
    domain = ros_domain_id()
    env = {**ros_env, "ROS_DOMAIN_ID": str(domain)}
    topics = {"/t/image": Image, "/t/depth": Image, "/t/camera_info": CameraInfo}
    listener = Listener(domain, topics)  # in the new domain only
    request.addfinalizer(listener.close)
    log = tmp_path / "player.log"
    params = {"wait_for_subscribers": 1, "lossless": True, "qos_depth": N_FRAMES}
    child = Child("p", _player(bags["mcap"], "/t", **params), log, env, forks)
    assert listener.wait_for(dict.fromkeys(topics, N_FRAMES)), log.read_text(encoding="utf-8")
    assert child.proc.wait(TIMEOUT) == 0
    assert "published 60 messages" in log.read_text(encoding="utf-8")
    expected = [f.stamp_ns for f in synthetic_frames(N_FRAMES, rate_hz=RATE_HZ)]
    got = [rosmsg.stamp_to_ns(m.header.stamp) for _, m in listener.received["/t/image"]]
    assert got == expected

    # a player waiting for a subscriber that never comes: stopped by SIGINT, cleanly
    waiting = _waiting_player(bags, tmp_path, env, forks)
    wlog, end = tmp_path / "w.log", time.monotonic() + TIMEOUT
    while "playing" not in wlog.read_text(encoding="utf-8") and time.monotonic() < end:
        time.sleep(0.05)  # until it waits for its subscribers
    pid = waiting.proc.pid
    assert waiting.alive() and os.getsid(pid) == pid  # a session of its own
    assert waiting.stop(TIMEOUT) == 0, wlog.read_text(encoding="utf-8")


_LAZY_IMPORTS = """
import importlib, sys
import numpy as np, torch
from fedepth_ros.replay.processes import PRELOAD
for name in PRELOAD:
    importlib.import_module(name)
torch.set_num_threads(1)
before = set(sys.modules)
from fedepth.data.sequence import Frame
from fedepth.models import create_model, get_state
from fedepth.recipe import TrainRecipe
from fedepth.strategies import TrainTask
from fedepth_ros.learner import BufferLearner, LearnerConfig
from fedepth_ros.sync import FrameBuffer
rng = np.random.default_rng(0)
k = np.array([[20.0, 0, 32], [0, 20.0, 24], [0, 0, 1]])
frames = [Frame(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8),
                rng.uniform(0.5, 5, (48, 64)).astype(np.float32), k, i * 10**8) for i in range(4)]
model = create_model("newcrfs-lite", min_depth=0.1, max_depth=80.0)
with FrameBuffer(8) as buffer:
    for f in frames:
        buffer.push(f)
    learner = BufferLearner("r", model, buffer, LearnerConfig(device="cpu", descriptor_frames=4))
    learner.descriptor()
    recipe = TrainRecipe(local_steps=1, batch_size=2, lr=1e-4, image_size=(32, 48))
    learner.train(0, TrainTask(state=get_state(model), recipe=recipe))
heavy = ("torch", "torchvision", "sympy", "triton")
print(sorted(m for m in set(sys.modules) - before if m.split(".")[0] in heavy))
"""


def test_the_preload_holds_what_a_robots_first_round_imports() -> None:
    """A forked robot would import whatever torch loads lazily on its first model, descriptor
    and round (seconds of CPU each time): the fork server's PRELOAD must hold it."""
    out = subprocess.run(
        [sys.executable, "-c", _LAZY_IMPORTS],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"imported after PRELOAD: {out.stdout}"


def _child(tmp_path: Path, name: str, code: str) -> Child:
    return Child(name, [sys.executable, "-c", code], tmp_path / f"{name}.log", dict(os.environ))


def test_a_robot_fails_when_its_node_exits_or_its_player_exits_with_a_status(
    tmp_path: Path,
) -> None:
    running = _child(tmp_path, "node", "import time; time.sleep(60)")
    done, undelivered = (
        _child(tmp_path, n, f"raise SystemExit({c})") for n, c in (("ok", 0), ("p3", 3))
    )
    dead = _child(tmp_path, "dead", "raise SystemExit(1)")
    try:
        for child in (done, undelivered, dead):
            child.proc.wait(TIMEOUT)
        assert failed_process(running, done) is None  # played its bag: fine
        assert failed_process(running, undelivered) is undelivered  # exit 3: not delivered
        assert failed_process(dead, done) is dead
    finally:
        running.stop(5.0)
