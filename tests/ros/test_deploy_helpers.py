"""ROS-free helpers of the deploy work: mangled parameters, point clouds, threads, cards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedepth.models import create_model, save_weights
from fedepth_ros import conversions as cv
from fedepth_ros.learner import build_model, set_threads
from fedepth_ros.node_common import empty_parameter_message


def test_an_empty_parameter_value_gets_the_working_spelling() -> None:
    msg = empty_parameter_message(["depth_node", "--ros-args", "-p", "coordinator:="])
    assert msg is not None and "coordinator" in msg and "\"''\"" in msg
    assert empty_parameter_message(["x", "--ros-args", "-p", 'coordinator:=""']) is None
    assert empty_parameter_message(["x", "--ros-args", "-p", "weights:=a"]) is None


def test_points_follow_the_pinhole_model() -> None:
    K = np.array([[50.0, 0, 3.5], [0, 40.0, 2.0], [0, 0, 1]])
    depth = np.full((5, 8), 2.0, np.float32)
    depth[0, 0] = np.nan
    pts = cv.depth_to_points(depth, K)
    assert pts.shape == (5, 8, 3) and np.isnan(pts[0, 0]).all()
    np.testing.assert_allclose(pts[4, 7], [(7 - 3.5) * 2 / 50, (4 - 2.0) * 2 / 40, 2.0], rtol=1e-6)


def test_threads_and_card_first_models(tmp_path: Path) -> None:
    assert set_threads(1) == 1
    with pytest.raises(ValueError):
        set_threads(-1)
    path = tmp_path / "w.safetensors"
    save_weights(create_model("regression-lite", max_depth=80.0), path)
    warned: list[str] = []
    model = build_model("regression-lite", 0.001, 10.0, str(path), warn=warned.append)
    assert model.max_depth == 80.0 and warned and "card wins" in warned[0]
