"""The training recipe on the wire: carried in the download header, checked on arrival."""

from __future__ import annotations

import numpy as np
import pytest

from fedepth.recipe import TrainRecipe
from fedepth_coordinator import serde
from fedepth_coordinator.domain import ModelHeader
from fedepth_coordinator.errors import InvalidArgumentError
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
