"""End to end on loopback: a real coordinator, two robot nodes fed by replayed M3ED-format bags,
two federated rounds, then a depth node routed by the coordinator on a third bag."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sensor_msgs.msg import CameraInfo, Image
from std_msgs.msg import String

from fedepth.data import M3EDSequence, rosmsg
from fedepth.descriptor import image_to_tensor
from fedepth.models import create_model, save_weights
from fedepth_cli.main import main as fedepth_main
from fedepth_coordinator.auth import add_principal
from fedepth_coordinator.client import CoordinatorClient, open_channel
from fedepth_coordinator.config import CoordinatorConfig, config_from_dict
from fedepth_coordinator.domain import Phase
from fedepth_coordinator.simulate import CoordinatorProcess

from .conftest import PLAY_AFTER_MATCH, Listener

pytestmark = [pytest.mark.ros, pytest.mark.slow]

MIN_DEPTH, MAX_DEPTH = 0.001, 80.0
ROBOTS = {  # namespace -> (principal, M3ED sequence of a different platform)
    "robot_a": ("robot-a", "train/car_urban_day_penno_small_loop"),
    "robot_b": ("robot-b", "train/spot_forest_easy_1"),
}
UNSEEN = "test/falcon_forest_road_2"
DESCRIPTOR_FRAMES = 3


def wait_until(
    predicate: Callable[[], bool],
    timeout_s: float,
    what: str,
    explain: Callable[[], str] | None = None,
) -> None:
    """Poll ``predicate`` until it holds; on timeout fail with ``explain()`` attached."""
    pause = threading.Event()
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            detail = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}{detail}")
        pause.wait(0.2)


def node_args(**params: Any) -> list[str]:
    out: list[str] = []
    for name, value in params.items():
        out += ["-p", f"{name}:={value}"]
    return out


class Processes:
    """Child processes of the test, logged to files, stopped with SIGINT (then killed)."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.env = {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        #: Processes that had already exited when ``interrupt`` came to signal them.
        self.exited_early: set[str] = set()

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with open(self.root / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        self.procs[name] = proc
        return proc

    def node(self, name: str, module: str, ns: str, params: dict[str, Any]) -> None:
        argv = [sys.executable, "-m", module, "--ros-args", "-r", f"__ns:=/{ns}"]
        self.start(name, argv + node_args(**params))

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{self.log(n)[-3000:]}" for n in self.procs)

    def interrupt(self, name: str, timeout_s: float = 30.0) -> int:
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        else:
            self.exited_early.add(name)
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"{name} did not stop on SIGINT:\n{self.log(name)}") from None

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def processes(tmp_path: Path, ros_env: dict[str, str]) -> Iterator[Processes]:
    procs = Processes(tmp_path, ros_env)
    yield procs
    procs.close()


@dataclass(frozen=True)
class Federation:
    """A small run's coordinator config, with credentials for its robots and an operator."""

    config: CoordinatorConfig
    token_files: dict[str, Path]
    ops_token: str


def initial_model(scenario: Path | None) -> torch.nn.Module:
    """The served regression-lite: fresh, with its batch-norm statistics taken from the robots'
    frames of ``scenario`` when given. A fresh encoder's deepest ReLU map is zero on every frame
    (GeM at its eps, every descriptor the same, no divergence ever above 0); with the frames'
    statistics its features respond to the frames, as a pretrained encoder's do."""
    torch.manual_seed(0)
    model = create_model("regression-lite", min_depth=MIN_DEPTH, max_depth=MAX_DEPTH)
    if scenario is not None:
        frames = [
            image_to_tensor(f.rgb)
            for _, seq in ROBOTS.values()
            for f in M3EDSequence(*(scenario / f"{seq}{s}.h5" for s in ("_data", "_depth_gt")))
        ]
        model.train()
        with torch.no_grad():
            model(torch.stack(frames))
        model.eval()
    return model


def small_federation(
    tmp_path: Path, principals: list[str], scenario: Path | None = None
) -> Federation:
    """Two rounds of FeDepth on loopback serving a regression-lite (:func:`initial_model`) with
    its card, every robot's token in a file, and the recipe the robots train with (2 steps at
    32x48)."""
    creds = tmp_path / "credentials.yaml"
    token_files: dict[str, Path] = {}
    for principal in principals:
        token_files[principal] = tmp_path / f"{principal}.token"
        token_files[principal].write_text(add_principal(creds, principal) + "\n")
    ops_token = add_principal(creds, "ops", "operator")
    initial = tmp_path / "initial.safetensors"
    save_weights(initial_model(scenario), initial)
    config = config_from_dict(
        {
            "server": {"host": "127.0.0.1", "port": 0, "max_wait_s": 2.0, "grace_s": 0.5},
            "auth": {"credentials_file": str(creds)},
            "rounds": {"num_rounds": 2, "min_robots": len(principals), "deadline_s": 120.0},
            # a fixed tau: with two robots a calibrated one can be 0, and re-routing scales by tau
            "strategy": {"name": "fedepth", "params": {"tau": 1000.0}},
            # the recipe every robot trains with (the nodes' own settings are only a fallback)
            "training": {"local_steps": 2, "batch_size": 2, "image_size": [32, 48]},
            "model": {"initial_weights": str(initial)},
            "state": {"dir": str(tmp_path / "state"), "backend": "sqlite"},
        }
    )
    return Federation(config, token_files, ops_token)


def make_bag(scenario: Path, sequence: str, out: Path) -> Path:
    data = scenario / f"{sequence}_data.h5"
    depth = scenario / f"{sequence}_depth_gt.h5"
    argv = ["bag", "from-m3ed", "--data", str(data), "--depth-gt", str(depth)]
    assert fedepth_main([*argv, "--out", str(out), "--no-progress"]) == 0
    return out


def test_two_robots_federate_then_the_depth_node_serves_the_routed_model(
    smoke_hpe: Path, tmp_path: Path, ros_env: dict[str, str], processes: Processes
) -> None:
    started = time.monotonic()
    bags = {ns: make_bag(smoke_hpe, seq, tmp_path / ns) for ns, (_, seq) in ROBOTS.items()}
    unseen_bag = make_bag(smoke_hpe, UNSEEN, tmp_path / "unseen")

    fed = small_federation(tmp_path, [p for p, _ in ROBOTS.values()], smoke_hpe)
    token_files, ops_token = fed.token_files, fed.ops_token
    coordinator = CoordinatorProcess(fed.config, log_path=tmp_path / "coordinator.log")
    port = coordinator.start()
    address = f"127.0.0.1:{port}"
    domain = int(ros_env["ROS_DOMAIN_ID"])
    status_topics = {f"/{ns}/fedepth/status": String for ns in ROBOTS}
    depth_topics = {
        "/unseen/depth_pred/image": Image,
        "/unseen/depth_pred/camera_info": CameraInfo,
        "/unseen/fedepth/route#latched": String,
    }
    listener = Listener(domain, {**status_topics, **depth_topics})
    ops = CoordinatorClient(open_channel(address), "ops", ops_token, wait_for_ready=True)
    try:
        common = {
            # no weights: both nodes build the model the coordinator's card names
            "coordinator": address,
            "device": "cpu",
        }
        for ns, (principal, _) in ROBOTS.items():
            params = {
                **common,
                "robot_id": principal,
                "token_file": token_files[principal],
                "buffer_size": 16,
                "frame_stride": 1,
                "descriptor_frames": DESCRIPTOR_FRAMES,
                "local_steps": 50,  # a fallback: the coordinator's recipe (2 steps) wins
                "status_period": 0.5,
            }
            processes.node(ns, "fedepth_ros.robot_node", ns, params)
            player = [sys.executable, "-m", "fedepth_ros.bag_player", str(bags[ns])]
            player += [*PLAY_AFTER_MATCH, "--wait-timeout", "90", "--ros-args", "-r"]
            processes.start(f"player_{ns}", [*player, f"__ns:=/{ns}"])

        def finished() -> bool:
            for name, proc in processes.procs.items():
                assert proc.poll() is None or name.startswith("player"), processes.logs()
            return ops.fleet_status().phase is Phase.FINISHED

        def explain() -> str:
            coordinator_log = (tmp_path / "coordinator.log").read_text(errors="replace")
            return f"{processes.logs()}\n--- coordinator\n{coordinator_log[-3000:]}"

        wait_until(finished, 150, "two federated rounds", explain)
        fleet = ops.fleet_status()
        assert fleet.round >= 1 and len(fleet.history) == 2, fleet
        assert [h.accepted for h in fleet.history] == [2, 2]
        assert {r.robot_id for r in fleet.robots} == {p for p, _ in ROBOTS.values()}
        for topic in status_topics:

            def reported_both(topic: str = topic) -> bool:
                with listener.cond:
                    msgs = listener.received[topic]
                    return bool(msgs) and json.loads(msgs[-1][1].data)["phase"] == "finished"

            wait_until(reported_both, 20, f"{topic} reporting the end of the run")
            status = json.loads(listener.received[topic][-1][1].data)
            assert status["rounds_done"] == 2 and status["error"] is None, status
            assert status["last_loss"] > 0 and status["buffer"]["size"] >= DESCRIPTOR_FRAMES
            assert status["recipe"] == "coordinator", status

        # the depth node on an unseen sequence, with robot-a's credentials
        principal = ROBOTS["robot_a"][0]
        depth_params = {
            **common,
            "robot_id": principal,
            "token_file": token_files[principal],
            "descriptor_frames": DESCRIPTOR_FRAMES,
            "queue_size": 16,
            "output_qos": "reliable",  # this listener subscribes reliably
            # re-routing with thresholds that any change trips: exercises drift -> Route
            "reroute": "true",
            "reroute_window": 2,
            "reroute_check_period": 1,
            "reroute_enter": 0.0,
            "reroute_exit": 0.0,
            "reroute_patience": 1,
            "reroute_cooldown": 0.0,
        }
        processes.node("depth", "fedepth_ros.depth_node", "unseen", depth_params)
        assert listener.wait_for_publishers(["/unseen/depth_pred/image"], timeout=60)
        player = [sys.executable, "-m", "fedepth_ros.bag_player", str(unseen_bag)]
        player += ["--topics", "/image,/camera_info", *PLAY_AFTER_MATCH, "--wait-timeout", "90"]
        processes.start("player_unseen", [*player, "--ros-args", "-r", "__ns:=/unseen"])
        seq = M3EDSequence(*(smoke_hpe / f"{UNSEEN}{s}.h5" for s in ("_data", "_depth_gt")))
        stamps = [f.stamp_ns for f in seq]
        assert processes.procs["player_unseen"].wait(90) == 0, processes.log("player_unseen")
        # images travel best effort (sensor-data QoS): on a loaded machine one may be lost
        if not listener.wait_for({"/unseen/depth_pred/image": len(stamps)}, timeout=20):
            assert len(listener.received["/unseen/depth_pred/image"]) >= DESCRIPTOR_FRAMES, (
                processes.logs()
            )
        assert processes.interrupt("depth") == 0, processes.log("depth")
        robot_exit = {ns: processes.interrupt(ns) for ns in ROBOTS}
        robot_logs = {ns: processes.log(ns) for ns in ROBOTS}
    finally:
        ops.close()
        listener.close()
        coordinator.stop()

    route = json.loads(listener.received["/unseen/fedepth/route#latched"][-1][1].data)
    assert route["source"] == "coordinator" and route["clusters"], route
    assert len(route["weights"]) == len(route["clusters"])
    assert sum(route["weights"]) == pytest.approx(1.0)
    first = json.loads(listener.received["/unseen/fedepth/route#latched"][0][1].data)
    assert first["round"] == 2, first  # started after the run: the last round's models
    preds = [m for _, m in listener.received["/unseen/depth_pred/image"]]
    got = [rosmsg.stamp_to_ns(m.header.stamp) for m in preds]
    assert set(got) <= set(stamps) and got == sorted(got)
    for msg in preds:
        assert msg.encoding == "32FC1" and msg.header.frame_id == "camera"
        depth = rosmsg.image_to_numpy(msg)
        assert depth.shape == seq[0].depth.shape
        valid = ~np.isnan(depth)
        assert valid.any() and np.isfinite(depth[valid]).all()
        assert depth[valid].min() >= MIN_DEPTH and depth[valid].max() <= MAX_DEPTH
    infos = [m for _, m in listener.received["/unseen/depth_pred/camera_info"]]
    assert infos and (infos[0].width, infos[0].height) == (seq[0].rgb.shape[1], len(seq[0].rgb))
    np.testing.assert_allclose(rosmsg.k_from_camera_info(infos[0]), seq[0].K)
    log = processes.log("depth")
    assert f"routed {DESCRIPTOR_FRAMES} frames to clusters" in log
    assert "re-routing on: drift against tau" in log and "scene drift: divergence" in log, log
    assert "routed 2 frames to clusters" in log  # the window's descriptor was routed
    assert len(listener.received["/unseen/fedepth/route#latched"]) >= 2
    print(
        f"end to end: {len(preds)}/{len(stamps)} depth frames, {time.monotonic() - started:.1f} s"
    )
    assert os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] == "LOCALHOST"
    crashed = {ns: code for ns, code in robot_exit.items() if code != 0}
    if crashed and set(crashed.values()) == {-11}:
        # Known open bug (issue 7): now and then a robot_node that has finished its run died
        # with SIGSEGV when interrupted, before logging its shutdown; not reproduced on purpose
        # so far. The nodes run with faulthandler on, so a crashed robot's log holds the Python
        # stack of every thread: the reason carries it (and the log's path) for the issue.
        where = {ns: str(processes.root / f"{ns}.log") for ns in crashed}
        early = sorted(set(crashed) & processes.exited_early)  # dead before the Ctrl-C came
        traces = {ns: robot_logs[ns].partition("Fatal Python error")[2][:2000] for ns in crashed}
        pytest.xfail(
            f"robot_node SIGSEGV (issue 7): {crashed}, already dead before SIGINT: {early}; "
            f"logs {where}; {traces}"
        )
    assert not crashed, robot_logs
