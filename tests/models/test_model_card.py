"""Model cards: written by save_weights, checked by load_weights, models built from them."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from fedepth.depth_range import FLEET
from fedepth.models import (
    CardMismatchError,
    ModelCard,
    card_of,
    create_model,
    get_state,
    load_model,
    load_weights,
    read_card,
    save_state,
    save_weights,
)


def test_saved_card_records_what_the_model_is(tmp_path: Path) -> None:
    model = create_model("regression-lite", min_depth=0.1, max_depth=80.0)
    path = tmp_path / "w.safetensors"
    save_weights(model, path, input_size=(64, 96))
    card = read_card(path)
    assert card is not None
    assert card.model == "regression-lite"
    assert (card.min_depth, card.max_depth) == (0.1, 80.0)
    assert card.input_size == (64, 96)
    assert card.normalization["mean"] == [0.485, 0.456, 0.406]
    assert card.normalization["std"] == [0.229, 0.224, 0.225]
    assert card.fedepth_version
    assert "encoder_weights" not in card.config
    assert ModelCard.from_json(card.to_json()) == card


def test_load_model_builds_from_the_card(tmp_path: Path) -> None:
    torch.manual_seed(3)
    model = create_model("newcrfs-lite", max_depth=80.0).eval()
    model.input_size = (48, 64)
    path = tmp_path / "w.safetensors"
    save_weights(model, path)
    clone = load_model(path).eval()
    assert clone.model_name == "newcrfs-lite" and clone.max_depth == 80.0
    assert clone.input_size == (48, 64)
    x = torch.rand(1, 3, 48, 64)
    with torch.no_grad():
        torch.testing.assert_close(clone(x), model(x))


def test_mismatch_is_one_line_naming_both_sides(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_weights(create_model("regression-lite", max_depth=80.0), path)
    with pytest.raises(CardMismatchError) as err:
        load_weights(create_model("regression-lite", max_depth=10.0), path)
    msg = str(err.value)
    assert "\n" not in msg
    assert "w.safetensors" in msg and "depth 0.001-80 m" in msg and "depth 0.001-10 m" in msg
    assert "max_depth" in msg
    with pytest.raises(CardMismatchError, match=r"newcrfs-lite.*regression-lite"):
        load_weights(create_model("regression-lite", max_depth=80.0), _saved(tmp_path))


def _saved(tmp_path: Path) -> Path:
    path = tmp_path / "crf.safetensors"
    save_weights(create_model("newcrfs-lite", max_depth=80.0), path)
    return path


def test_weights_without_a_card_load_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = create_model("regression-lite")
    path = tmp_path / "old.safetensors"
    save_state(path, get_state(model))
    assert read_card(path) is None
    with caplog.at_level(logging.WARNING):
        load_weights(create_model("regression-lite"), path)
    assert "no model card" in caplog.text and "old.safetensors" in caplog.text
    with pytest.raises(ValueError, match="no model card"):
        load_model(path)


def test_card_of_needs_a_registry_model() -> None:
    with pytest.raises(ValueError, match="create_model"):
        card_of(torch.nn.Linear(2, 2))
    card = card_of(create_model("regression-lite"))
    assert json.loads(card.to_json())["model"] == "regression-lite"
    assert np.isclose(card.max_depth, FLEET.max_depth)  # create_model's default range
