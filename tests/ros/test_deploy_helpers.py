"""ROS-free helpers of the deploy work: mangled parameters, point clouds, threads, cards."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from fedepth.data import rosmsg
from fedepth.models import card_of, create_model, get_state, save_state, save_weights
from fedepth_ros.border import border_fractions, mask_border
from fedepth_ros.learner import check_served, model_from_card, model_from_weights, set_threads
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
    pts = rosmsg.depth_to_points(depth, K)
    assert pts.shape == (5, 8, 3) and np.isnan(pts[0, 0]).all()
    np.testing.assert_allclose(pts[4, 7], [(7 - 3.5) * 2 / 50, (4 - 2.0) * 2 / 40, 2.0], rtol=1e-6)


def test_mask_border_blanks_whole_pixels_of_each_side_and_nothing_else() -> None:
    depth = np.arange(80 * 128, dtype=np.float32).reshape(80, 128)
    out = mask_border(depth, border_fractions([0.125, 0.1, 0.07, 0.0]))  # 10, 8, 9 (8.96), 0
    assert np.isnan(out[:10]).all() and np.isnan(out[-8:]).all() and np.isnan(out[:, :9]).all()
    np.testing.assert_array_equal(out[10:-8, 9:], depth[10:-8, 9:])
    assert np.isnan(out).sum() == 80 * 128 - 62 * 119
    assert not np.isnan(depth).any()  # a copy: the model's output is left as it was
    np.testing.assert_array_equal(mask_border(depth, (0.0, 0.0, 0.0, 0.0)), depth)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([0.1, 0.1, 0.1], "four numbers (top, bottom, left, right), got 3"),
        ([0.1, 0.1, -0.1, 0.0], "left must be in [0, 0.5), got -0.1"),
        (["x", 0, 0, 0], "four numbers"),
        (0.1, "four numbers"),
    ],
)
def test_mask_border_rejects_what_is_not_four_fractions_below_a_half(
    value: object, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        border_fractions(value)


def test_threads_and_card_first_models(tmp_path: Path) -> None:
    assert set_threads(1) == 1
    with pytest.raises(ValueError):
        set_threads(-1)
    path = tmp_path / "w.safetensors"
    save_weights(create_model("regression-lite", max_depth=80.0), path)
    model = model_from_weights(str(path))  # the card says what the model is
    assert model.model_name == "regression-lite" and model.max_depth == 80.0
    bare = tmp_path / "bare.safetensors"  # no card: nothing to build it from
    save_state(bare, get_state(create_model("regression-lite")))
    with pytest.raises(ValueError, match="no model card"):
        model_from_weights(str(bare))
    served = card_of(create_model("newcrfs-lite", max_depth=20.0)).to_json()
    built = model_from_card(served, "the coordinator x")
    assert built.model_name == "newcrfs-lite" and built.max_depth == 20.0
    check_served(built, served, "the coordinator x")  # the same model: no error
    with pytest.raises(
        ValueError, match=r"regression-lite.*serves newcrfs-lite.*differs in model"
    ):
        check_served(model, served, "the coordinator x")
    with pytest.raises(ValueError, match="without a card"):
        model_from_card(None, "the coordinator x")
    # a served card whose encoder checkpoint this machine does not hold is refused, naming it
    other = json.loads(served)
    other["encoder_checkpoint"]["sha256"] = "f" * 64
    with pytest.raises(ValueError) as err:
        model_from_card(json.dumps(other), "the coordinator x")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("the coordinator x serves newcrfs-lite")
    assert "refused here" in msg and "mobilenet_v2-b0353104.pth" in msg
    with pytest.raises(ValueError, match="without a card"):
        check_served(model, None, "the coordinator x")
