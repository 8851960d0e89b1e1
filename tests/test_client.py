"""train_round: the one client-round function, driven by the task's recipe."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
import torch

from fedepth.client import round_dataset, train_round
from fedepth.data import Frame, Sequence, SequenceMeta
from fedepth.models import create_model, get_state
from fedepth.recipe import TrainRecipe
from fedepth.strategies import TrainTask
from fedepth.strategies.scaffold import CLIENT_CONTROL

RECIPE = TrainRecipe(local_steps=2, batch_size=2, image_size=(32, 48), lr=1e-3, seed=5)


class Frames(Sequence):
    """An in-memory sequence over given frames."""

    def __init__(self, frames: list[Frame]) -> None:
        super().__init__("mem", SequenceMeta("car", "urban_day", "test", "train"))
        self.frames = frames

    def __len__(self) -> int:
        return len(self.frames)

    def _frame(self, i: int) -> Frame:
        return self.frames[i]


def make_frames(n: int, h: int = 40, w: int = 56, seed: int = 0) -> list[Frame]:
    rng = np.random.default_rng(seed)
    k = np.array([[30.0, 0, w / 2], [0, 30.0, h / 2], [0, 0, 1]])
    ramp = np.tile(np.linspace(1.0, 6.0, w, dtype=np.float32), (h, 1))
    return [
        Frame(
            rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
            (ramp + rng.uniform(0, 0.5, (h, w))).astype(np.float32),
            k,
            i,
        )
        for i in range(n)
    ]


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model("regression-lite", min_depth=0.1, max_depth=10.0)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_sequences_and_loose_frames_train_alike() -> None:
    frames = make_frames(5)
    model = _model()
    task = TrainTask(state=get_state(model), recipe=RECIPE)
    split = [Frames(frames[:2]), Frames(frames[2:])]
    a = train_round(model, task, split, cid="c1", rnd=3, device="cpu")
    b = train_round(model, task, frames, cid="c1", rnd=3, device="cpu")
    c = train_round(model, task, Frames(frames), cid="c1", rnd=3, device="cpu")
    assert _same(dict(a.update.state), dict(b.update.state))
    assert _same(dict(a.update.state), dict(c.update.state))
    assert a.update.metrics == b.update.metrics
    assert (a.update.cid, a.update.num_samples, a.update.num_steps) == ("c1", 5, 2)
    assert a.seconds > 0
    # another client or round: another seed, other weights
    other = train_round(model, task, frames, cid="c2", rnd=3, device="cpu")
    assert not _same(dict(a.update.state), dict(other.update.state))


def test_the_dataset_follows_the_recipe() -> None:
    frames = make_frames(3)
    items = round_dataset(frames, RECIPE, seed=1)
    rgb, depth = items[0]
    assert rgb.shape == (3, 32, 48) and depth.shape == (1, 32, 48)
    assert items.flip and items.seed == 1
    plain = round_dataset(frames, TrainRecipe(image_size=(32, 48), flip=False), seed=1)
    flipped = [not torch.equal(items[i][1], plain[i][1]) for i in range(3)]
    assert flipped == [
        np.random.default_rng([1, 0, i]).random() < 0.5 for i in range(3)
    ]  # (seed, epoch, index) decides, as FrameDataset always did
    with pytest.raises(TypeError, match="not a mix"):
        round_dataset([frames[0], Frames(frames)], RECIPE, seed=1)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="no frames"):
        round_dataset([], RECIPE, seed=1)


def test_the_tasks_recipe_wins_and_one_is_needed() -> None:
    frames = make_frames(4)
    model = _model()
    start = get_state(model)
    fallback = TrainRecipe(local_steps=1, batch_size=2, image_size=(32, 48))
    sent = train_round(
        model, TrainTask(state=start, recipe=RECIPE), frames, cid="c", rnd=0, fallback=fallback
    )
    assert sent.update.num_steps == RECIPE.local_steps
    local = train_round(model, TrainTask(state=start), frames, cid="c", rnd=0, fallback=fallback)
    assert local.update.num_steps == 1
    with pytest.raises(ValueError, match="no training recipe"):
        train_round(model, TrainTask(state=start), frames, cid="c", rnd=0)


def test_hook_memory_is_returned_not_modified() -> None:
    frames = make_frames(4)
    model = _model()
    task = TrainTask(state=get_state(model), hook="scaffold", recipe=RECIPE)
    memory: dict = {}
    first = train_round(model, task, frames, cid="c", rnd=0, memory=memory, device="cpu")
    assert memory == {} and CLIENT_CONTROL in first.memory
    assert first.update.extra  # SCAFFOLD's control delta goes up with the update
    second = train_round(model, task, frames, cid="c", rnd=1, memory=first.memory, device="cpu")
    assert second.memory[CLIENT_CONTROL] is not first.memory[CLIENT_CONTROL]


def test_the_recipes_loss_lambda_trains_and_the_models_own_is_kept() -> None:
    frames = make_frames(4)
    states, losses = [], []
    for focus in (None, 0.85, 0.2):
        model = _model()
        task = TrainTask(state=get_state(model), recipe=replace(RECIPE, variance_focus=focus))
        res = train_round(model, task, frames, cid="c", rnd=0)
        assert model.variance_focus == 0.85  # the model's own lambda after the round
        states.append(res.update.state)
        losses.append(res.update.metrics["loss"])
    assert _same(states[0], states[1])  # None is the model's own 0.85
    assert not _same(states[0], states[2]) and losses[2] != losses[0]
