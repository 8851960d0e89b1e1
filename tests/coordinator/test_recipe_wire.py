"""The training recipe on the wire: carried in the download header, checked on arrival, with
each round's lr."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from fedepth.descriptor import Descriptor
from fedepth.recipe import TrainRecipe, round_lr
from fedepth.strategies import ClientUpdate
from fedepth_coordinator import serde
from fedepth_coordinator.client import CoordinatorClient
from fedepth_coordinator.config import CoordinatorConfig
from fedepth_coordinator.domain import ModelHeader
from fedepth_coordinator.errors import InvalidArgumentError
from fedepth_coordinator.server import running
from fedepth_coordinator.simulate import robot_ids
from fedepth_coordinator.tensors import Layout

LAYOUT = Layout.of({"state": {"w": np.zeros(3, np.float32)}})


@pytest.mark.parametrize(
    "recipe",
    [
        TrainRecipe(),
        TrainRecipe(
            local_steps=7,
            batch_size=3,
            optimizer="sgd",
            lr=0.0123,
            weight_decay=0.0,
            momentum=0.9,
            grad_clip=None,
            schedule="cosine",
            warmup_steps=2,
            final_lr_fraction=0.05,
            image_size=(96, 128),
            flip=False,
            seed=-(1 << 40),
            variance_focus=0.5,
        ),
    ],
)
def test_the_recipe_survives_the_download_header_exactly(recipe: TrainRecipe) -> None:
    header = ModelHeader(4, LAYOUT, "scaffold", {"lr": 0.1}, recipe=recipe)
    wire = serde.model_header_to_pb(header).SerializeToString()
    msg = type(serde.model_header_to_pb(header)).FromString(wire)
    assert serde.model_header_from_pb(msg) == header  # floats as doubles: bit-exact


def test_a_header_without_a_recipe_reads_as_none() -> None:
    msg = serde.model_header_to_pb(ModelHeader(0, LAYOUT))
    assert not msg.HasField("recipe")
    assert serde.model_header_from_pb(msg).recipe is None


def test_a_bad_recipe_is_an_invalid_argument() -> None:
    msg = serde.model_header_to_pb(ModelHeader(0, LAYOUT, recipe=TrainRecipe()))
    msg.recipe.optimizer = "lamb"
    with pytest.raises(InvalidArgumentError, match=r"invalid training recipe.*lamb"):
        serde.model_header_from_pb(msg)
    msg.recipe.optimizer = "adamw"
    msg.recipe.image_width = 0
    with pytest.raises(InvalidArgumentError, match="image_size"):
        serde.model_header_from_pb(msg)


def test_each_round_s_task_carries_the_lr_of_the_round_schedule(
    config_factory: Callable[..., CoordinatorConfig],
    connect: Callable[..., CoordinatorClient],
) -> None:
    config = config_factory(
        rounds={"num_rounds": 3, "min_robots": 2, "quorum": 1.0},
        training={"lr": 1e-3, "round_schedule": "cosine", "round_final_lr_fraction": 0.2},
    )
    robots = robot_ids(2)
    lrs: dict[int, list[float]] = {}
    with running(config) as server:
        clients = [connect(server.port, r) for r in robots]
        for c in clients:
            c.register(10, {})
            c.upload_descriptor(Descriptor(np.zeros(8), np.ones(8), 4))
        for rnd in range(3):
            for c in clients:
                got = c.download_model(rnd)
                assert got.task.recipe is not None
                lrs.setdefault(rnd, []).append(got.task.recipe.lr)
                c.upload_update(rnd, ClientUpdate(c.robot_id, got.task.state, 10))
    for rnd, got in lrs.items():  # every robot of a round gets that round's lr
        assert got == pytest.approx([round_lr(1e-3, rnd, 3, "cosine", 0.2)] * 2)
    assert lrs[0] == [1e-3, 1e-3] and lrs[2] == pytest.approx([2e-4, 2e-4])
