"""robot_node and depth_node against a real coordinator: the served card decides the model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from std_msgs.msg import String

from fedepth.models import create_model, save_weights
from fedepth_coordinator.auth import add_principal
from fedepth_coordinator.config import config_from_dict
from fedepth_coordinator.server import running

from .conftest import TIMEOUT, start_player
from .test_nodes import start_node, stop

pytestmark = pytest.mark.ros


def test_nodes_build_the_served_model_and_refuse_weights_of_another(
    bags: dict[str, Path], ros_env: dict[str, str], listener_factory: Any, tmp_path: Path
) -> None:
    creds = tmp_path / "credentials.yaml"
    token = tmp_path / "robot-a.token"
    token.write_text(add_principal(creds, "robot-a") + "\n")
    config = config_from_dict(
        {
            "server": {"host": "127.0.0.1", "port": 0, "max_wait_s": 2.0},
            "auth": {"credentials_file": str(creds)},
            "rounds": {"num_rounds": 1, "min_robots": 2},
            # served untrained: the card decides, what the network learnt does not matter
            "model": {"name": "regression-lite", "max_depth": 80.0, "pretrain": "none"},
            "state": {"dir": str(tmp_path / "state"), "backend": "sqlite"},
        }
    )
    wrong = tmp_path / "indoor.safetensors"  # the served network, but a 10 m depth range
    save_weights(create_model("regression-lite", max_depth=10.0), wrong)
    listener = listener_factory({"/r/fedepth/status": String, "/diagnostics": DiagnosticArray})
    with running(config) as server:
        common = {
            "robot_id": "robot-a",
            "coordinator": f"127.0.0.1:{server.port}",
            "token_file": token,
            "device": "cpu",
            "descriptor_frames": 2,
            "status_period": 0.3,
        }
        nodes = {
            "robot": start_node("robot_node", "r", {**common, "weights": wrong}, ros_env),
            "depth_wrong": start_node("depth_node", "r", {**common, "weights": wrong}, ros_env),
            # no weights: the model the coordinator's card names (routing then waits: no fleet)
            "depth_served": start_node("depth_node", "s", common, ros_env),
        }
        # every player publisher waits for a subscriber: the depth node takes no depth topic
        topics = {"r": "/image,/depth,/camera_info", "s": "/image,/camera_info"}
        players = [
            start_player(
                [
                    str(bags["mcap"]),
                    "--loop",
                    "--topics",
                    topics[ns],
                    "--wait-for-subscribers",
                    "1",
                    "--wait-timeout",
                    str(3 * TIMEOUT),
                    "--ros-args",
                    "-r",
                    f"__ns:=/{ns}",
                ],
                ros_env,
            )
            for ns in topics
        ]

        def status() -> dict[str, Any]:
            msgs = listener.received["/r/fedepth/status"]
            return json.loads(msgs[-1][1].data) if msgs else {}

        def diagnostics(node: str, text: str) -> list[DiagnosticStatus]:
            return [
                s
                for _, m in listener.received["/diagnostics"]
                for s in m.status
                if text in s.message and s.name.startswith(node)
            ]

        def card_error() -> list[DiagnosticStatus]:
            return diagnostics("/r/depth_node", "cannot route")

        def served_routes() -> list[DiagnosticStatus]:
            # routing is tried (and waits: no fleet yet) only once the served model is built
            return diagnostics("/s/depth_node", "Route: FAILED_PRECONDITION")

        with listener.cond:
            assert listener.cond.wait_for(
                lambda: status().get("error") and card_error() and served_routes(), 6 * TIMEOUT
            ), (status(), [n.poll() for n in nodes.values()])
        for player in players:
            stop(player)
        logs = {name: stop(proc)[1] for name, proc in nodes.items()}
    refused = status()["error"]
    # Register refused the robot with a status naming both models and what differs
    assert "Register: FAILED_PRECONDITION" in refused, refused
    assert "declares regression-lite {" in refused and "depth 0.001-10 m" in refused
    assert "serves regression-lite {" in refused and "depth 0.001-80 m" in refused
    assert "differs in max_depth" in refused
    diag = card_error()[-1]
    assert diag.level == DiagnosticStatus.ERROR
    assert (
        "0.001-10 m" in diag.message
        and "serves regression-lite {" in diag.message
        and "depth 0.001-80 m" in diag.message
    )
    assert "predicting with the local weights only" in diag.message
    served = logs["depth_served"]
    assert "built the served model" in served and "serves regression-lite {" in served
    assert "depth 0.001-80 m" in served
    for name, log in logs.items():
        assert "Traceback" not in log, (name, log)
