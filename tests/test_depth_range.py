"""One depth-range rule (fedepth.depth_range.check_depth_range: 0 < min_depth < max_depth, both
finite) at every front end that takes a depth range in."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from fedepth.data.bags import BagError
from fedepth.data.sequence import SequenceMeta
from fedepth.depth_range import DepthRange, check_depth_range
from fedepth.models import ModelCard, create_model
from fedepth.models.registry import _REGISTRY

REFUSED = [(0.0, 10.0), (-1.0, 10.0), (5.0, 5.0), (10.0, 1.0), (1e-3, float("inf"))]
REFUSED += [(float("nan"), 10.0)]
ACCEPTED = (1e-3, 10.0)
RULE = r"need 0 < min_depth < max_depth \(finite\)"


def _coordinator(lo: float, hi: float) -> None:
    from fedepth_coordinator.config import load_config

    load_config(None, [("model.min_depth", lo), ("model.max_depth", hi)])


def _card_json(lo: float, hi: float) -> None:
    card = json.loads(ModelCard(model="regression-lite").to_json())
    ModelCard.from_json(json.dumps({**card, "min_depth": lo, "max_depth": hi}))


FRONTS: dict[str, Callable[[float, float], object]] = {
    "rule": check_depth_range,
    "DepthRange": DepthRange,
    "SequenceMeta": lambda lo, hi: SequenceMeta("car", "urban_day", "kitti", "train", lo, hi),
    "create_model": lambda lo, hi: create_model("regression-lite", min_depth=lo, max_depth=hi),
    # the model base class itself, past the registry's check
    "DepthModel": lambda lo, hi: _REGISTRY["regression-lite"](min_depth=lo, max_depth=hi),
    "ModelCard": lambda lo, hi: ModelCard(model="regression-lite", min_depth=lo, max_depth=hi),
    "ModelCard.from_json": _card_json,
    "coordinator config": _coordinator,
}


@pytest.mark.parametrize("name", FRONTS)
def test_every_front_end_refuses_a_zero_minimum_and_accepts_a_millimetre(name: str) -> None:
    FRONTS[name](*ACCEPTED)
    for lo, hi in REFUSED:
        with pytest.raises(ValueError, match=RULE):
            FRONTS[name](lo, hi)


def test_the_depth_scorer_refuses_a_bag_whose_range_breaks_the_rule(tmp_path: Path) -> None:
    pytest.importorskip("rclpy")
    from fedepth.data.bag_writer import synthetic_frames, write_rgbd_bag
    from fedepth_ros.depth_scorer import GroundTruth

    for lo, ok in ((1e-3, True), (0.0, False)):
        bag = tmp_path / f"min-{lo:g}"
        custom = {"fedepth.min_depth": f"{lo:g}", "fedepth.max_depth": "10"}
        write_rgbd_bag(synthetic_frames(2), bag, custom_data=custom, progress=False)
        if ok:
            assert GroundTruth(bag).min_depth == lo
        else:
            with pytest.raises(BagError, match=RULE):
                GroundTruth(bag)
