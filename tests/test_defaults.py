"""One typed source per default: depth ranges (fedepth.depth_range), the training recipe
(fedepth.recipe.TrainRecipe, its optimizer settings from fedepth.optconfig.OptimizerConfig).

Every other place that needs such a default takes it from there; these tests fail when one of
them grows its own value again."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
import yaml

from fedepth import depth_range
from fedepth.data.sequence import SequenceMeta
from fedepth.depth_range import FLEET, INDOOR, OUTDOOR, DepthRange
from fedepth.models import ModelCard, create_model
from fedepth.optconfig import OptimizerConfig
from fedepth.recipe import TrainRecipe
from fedepth.sim import SimConfig

ROOT = Path(__file__).resolve().parents[1]


def _range(obj: object) -> DepthRange:
    return DepthRange(obj.min_depth, obj.max_depth)  # type: ignore[attr-defined]


def test_the_two_ranges_are_the_benchmarks_caps() -> None:
    assert (INDOOR.min_depth, INDOOR.max_depth) == (1e-3, 10.0)  # NYUv2
    assert (OUTDOOR.min_depth, OUTDOOR.max_depth) == (1e-3, 80.0)  # KITTI
    assert depth_range.for_environment("indoor") == INDOOR
    assert depth_range.for_environment("urban_night") == OUTDOOR
    with pytest.raises(ValueError, match="min_depth < max_depth"):
        DepthRange(10.0, 1.0)


def test_every_default_depth_range_is_the_fleets() -> None:
    from fedepth_coordinator.config import load_config

    assert _range(SimConfig()) == FLEET
    assert _range(ModelCard(model="regression-lite")) == FLEET
    assert _range(SequenceMeta("car", "urban_day", "kitti", "train")) == FLEET
    assert _range(load_config(None).model) == FLEET
    signature = inspect.signature(create_model).parameters
    assert (signature["min_depth"].default, signature["max_depth"].default) == (
        FLEET.min_depth,
        FLEET.max_depth,
    )
    model = create_model("regression-lite")
    assert (model.min_depth, model.max_depth) == (FLEET.min_depth, FLEET.max_depth)


def test_the_recipe_defaults_have_one_source() -> None:
    recipe = TrainRecipe()
    optimizer = OptimizerConfig()
    for name in ("lr", "weight_decay", "momentum", "grad_clip", "schedule", "warmup_steps"):
        assert getattr(recipe, name) == getattr(optimizer, name), name
    assert recipe.optimizer == optimizer.name
    # the simulation's fields named as the recipe's have the recipe's defaults
    sim = SimConfig()
    shared = {f.name for f in dataclasses.fields(TrainRecipe)} & {
        f.name for f in dataclasses.fields(SimConfig)
    }
    assert {"lr", "local_steps", "batch_size", "image_size"} <= shared
    for name in shared:
        assert getattr(sim, name) == getattr(recipe, name), name
    assert sim.recipe(0) == recipe


def test_a_robots_fallback_recipe_is_the_recipe_and_its_yaml_says_so() -> None:
    from fedepth_ros.learner import LearnerConfig
    from fedepth_ros.params import ROBOT_NODE

    recipe = TrainRecipe()
    for name in ("local_steps", "batch_size", "lr"):
        assert ROBOT_NODE[name][0] == getattr(recipe, name), name
    assert LearnerConfig().fallback_recipe(recipe.image_size) == recipe
    doc = yaml.safe_load((ROOT / "config" / "robot.yaml").read_text())
    params = doc["/**/robot_node"]["ros__parameters"]
    assert {k: params[k] for k in ("local_steps", "batch_size", "lr")} == {
        "local_steps": recipe.local_steps,
        "batch_size": recipe.batch_size,
        "lr": recipe.lr,
    }
