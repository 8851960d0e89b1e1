"""TrainRecipe: validation, dict round trip, the per-client seed, the LocalTrainer settings."""

from __future__ import annotations

import itertools
import json
import zlib
from dataclasses import replace
from typing import Any

import pytest

from fedepth.recipe import ROUND_SCHEDULES, TrainRecipe, client_seed, round_lr
from fedepth.sim import SimConfig
from fedepth.sim import client_seed as sim_client_seed


def test_defaults_are_the_simulations() -> None:
    assert SimConfig().recipe(0) == TrainRecipe()
    r = TrainRecipe()
    assert (r.local_steps, r.batch_size, r.lr, r.weight_decay) == (5, 4, 1e-4, 1e-2)
    assert (r.optimizer, r.schedule, r.warmup_steps, r.grad_clip) == ("adamw", "constant", 0, 1.0)
    assert (r.image_size, r.flip, r.seed) == ((48, 64), True, 0)


def test_client_seed_keeps_its_definition_and_its_old_home() -> None:
    assert client_seed(3, 7, "car-1") == zlib.crc32(b"3/7/car-1")
    assert sim_client_seed is client_seed
    recipe = TrainRecipe(seed=3)
    assert recipe.round_seed(7, "car-1") == client_seed(3, 7, "car-1")
    seeds = {recipe.round_seed(r, c) for r in range(3) for c in ("a", "b")}
    assert len(seeds) == 6  # every client and round its own


def test_dict_round_trip_is_json_friendly() -> None:
    recipe = TrainRecipe(
        local_steps=9,
        optimizer="sgd",
        momentum=0.9,
        grad_clip=None,
        schedule="cosine",
        warmup_steps=2,
        final_lr_fraction=0.0,
        image_size=(32, 48),
        flip=False,
        seed=-4,
    )
    data = json.loads(json.dumps(recipe.to_dict()))
    assert data["image_size"] == [32, 48] and data["grad_clip"] is None
    assert TrainRecipe.from_dict(data) == recipe
    assert TrainRecipe.from_dict({"lr": 1e-3}) == TrainRecipe(lr=1e-3)  # missing: defaults
    with pytest.raises(ValueError, match=r"unknown key.*learning_rate"):
        TrainRecipe.from_dict({"learning_rate": 1e-3})


def test_numbers_are_normalized() -> None:
    r = TrainRecipe(lr=1, weight_decay=0, grad_clip=2, image_size=[16, 32])  # type: ignore[arg-type]
    assert isinstance(r.lr, float) and isinstance(r.grad_clip, float)
    assert r.image_size == (16, 32) and hash(r) == hash(replace(r))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"local_steps": 0}, "local_steps must be an integer > 0"),
        ({"batch_size": 2.5}, "batch_size must be an integer > 0"),
        ({"optimizer": "lamb"}, "unknown optimizer 'lamb'; known: adamw, adam, sgd"),
        ({"lr": 0.0}, "lr must be a number > 0"),
        ({"lr": float("nan")}, "lr must be a number > 0"),
        ({"weight_decay": -1.0}, "weight_decay must be a number >= 0"),
        ({"momentum": 1.0}, r"momentum must lie in \[0, 1\)"),
        ({"grad_clip": 0.0}, "grad_clip must be a number > 0 or None"),
        ({"schedule": "step"}, "unknown schedule 'step'; known: constant, cosine"),
        ({"warmup_steps": 5}, r"warmup_steps must be an integer in \[0, local_steps\)"),
        ({"final_lr_fraction": -0.1}, r"final_lr_fraction must lie in \[0, 1\]"),
        ({"image_size": (48,)}, "image_size must be"),
        ({"image_size": (0, 64)}, "image_size must be"),
        ({"flip": 1}, "flip must be true or false"),
        ({"seed": 1 << 63}, "seed must be a 64-bit integer"),
        ({"local_steps": True}, "local_steps must be an integer"),
        ({"variance_focus": 1.5}, r"variance_focus must lie in \[0, 1\] or be None"),
    ],
)
def test_bad_values_are_clear_errors(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainRecipe(**changes)


def test_train_config_carries_every_training_setting() -> None:
    recipe = TrainRecipe(
        local_steps=6,
        batch_size=3,
        optimizer="adam",
        lr=1e-3,
        weight_decay=0.0,
        grad_clip=None,
        schedule="cosine",
        warmup_steps=1,
        final_lr_fraction=0.5,
    )
    tc = recipe.train_config(11, device="cpu")
    assert (tc.num_steps, tc.batch_size, tc.seed, tc.device) == (6, 3, 11, "cpu")
    o = tc.optimizer
    assert (o.name, o.lr, o.weight_decay, o.grad_clip) == ("adam", 1e-3, 0.0, None)
    assert (o.schedule, o.warmup_steps, o.final_lr_fraction) == ("cosine", 1, 0.5)
    # the simulation's trainer settings are its recipe's, as before the recipe existed
    sim = SimConfig(local_steps=3, lr=2e-4).train_config(5)
    assert sim == TrainRecipe(local_steps=3, lr=2e-4).train_config(5)
    assert sim.optimizer.grad_clip == 1.0 and sim.optimizer.name == "adamw"


def test_round_lr_is_constant_or_a_cosine_from_lr_to_its_final_fraction() -> None:
    assert [round_lr(1e-3, r, 5, "constant", 0.1) for r in range(5)] == [1e-3] * 5
    cos = [round_lr(1e-3, r, 5, "cosine", 0.1) for r in range(5)]
    assert cos[0] == pytest.approx(1e-3) and cos[-1] == pytest.approx(1e-4)
    assert cos[2] == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))  # halfway: the mean of the ends
    assert all(a > b for a, b in itertools.pairwise(cos))
    assert round_lr(1e-3, 0, 1, "cosine", 0.1) == 1e-3  # a one-round run keeps its lr
    with pytest.raises(ValueError, match="unknown round schedule 'linear'; known: constant"):
        round_lr(1e-3, 0, 5, "linear", 0.1)
    with pytest.raises(ValueError, match=r"final lr fraction must lie in \[0, 1\]"):
        round_lr(1e-3, 0, 5, "cosine", 1.5)


def test_the_simulation_and_the_coordinator_give_each_round_its_lr() -> None:
    from fedepth_coordinator.config import TrainingConfig

    sim = SimConfig(rounds=4, lr=2e-4, round_schedule="cosine", round_final_lr_fraction=0.25)
    training = TrainingConfig(lr=2e-4, round_schedule="cosine", round_final_lr_fraction=0.25)
    for rnd in range(4):
        expected = round_lr(2e-4, rnd, 4, "cosine", 0.25)
        assert sim.recipe(rnd).lr == pytest.approx(expected)
        assert training.recipe(rnd, 4) == sim.recipe(rnd)  # one recipe, both drivers
    assert SimConfig(rounds=4).recipe(3).lr == SimConfig().lr  # constant by default


def test_the_cli_offers_the_round_schedules_the_recipe_knows() -> None:
    from fedepth_cli.main import build_parser

    bench = build_parser()._subparsers._group_actions[0].choices["bench"]  # type: ignore[union-attr]
    (action,) = [a for a in bench._actions if a.dest == "round_schedule"]
    assert tuple(action.choices or ()) == ROUND_SCHEDULES
