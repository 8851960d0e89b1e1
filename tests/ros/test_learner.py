"""BufferLearner and DepthPredictor without ROS: descriptor, local rounds with a client hook,
spilled frames in training, the coordinator's recipe (and the fallback), the simulation's
weights for the same task and frames, inference range and NaN handling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedepth.data.sequence import Frame, Sequence, SequenceMeta
from fedepth.models import create_model, get_state
from fedepth.recipe import TrainRecipe
from fedepth.sim import ClientJob, SimConfig, run_job
from fedepth.strategies import TrainTask
from fedepth.strategies.pacfl import BASIS_KEY
from fedepth.strategies.scaffold import CLIENT_CONTROL
from fedepth_ros.learner import (
    BufferLearner,
    DepthPredictor,
    LearnerConfig,
    resolve_device,
)
from fedepth_ros.sync import FrameBuffer


def frames(n: int, h: int = 24, w: int = 32) -> list[Frame]:
    rng = np.random.default_rng(0)
    k = np.array([[20.0, 0, w / 2], [0, 20.0, h / 2], [0, 0, 1]])
    return [
        Frame(
            rng.integers(0, 256, (h, w, 3), dtype=np.uint8),
            rng.uniform(0.5, 5.0, (h, w)).astype(np.float32),
            k,
            i * 100_000_000,
        )
        for i in range(n)
    ]


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def test_resolve_device() -> None:
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="device must be auto, cpu, cuda or cuda:N"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda:0")


def test_learner_descriptor_and_rounds_with_a_client_hook(tmp_path: Path) -> None:
    model = create_model("regression-lite", min_depth=0.1, max_depth=10.0)
    initial = get_state(model)
    with FrameBuffer(4, spill_dir=tmp_path / "spill", spill_capacity=4) as buffer:
        for f in frames(8):
            buffer.push(f)
        assert buffer.flush() and len(buffer) == 8  # half of the frames are on disk
        config = LearnerConfig(local_steps=2, batch_size=2, descriptor_frames=5, device="cpu")
        learner = BufferLearner("robot-x", model, buffer, config)
        descriptor = learner.descriptor()
        assert descriptor.num_frames == 5 and learner.state.phase == "joined"
        basis = learner.summaries[BASIS_KEY]  # PACFL's summary goes with every descriptor
        assert basis.shape == (descriptor.dim, 3)
        np.testing.assert_allclose(basis.T @ basis, np.eye(3), atol=1e-8)
        for rnd in range(2):
            task = TrainTask(state=initial, hook="scaffold")
            update = learner.train(rnd, task)
            assert update.cid == "robot-x" and update.num_samples == 8 and update.num_steps == 2
            assert np.isfinite(update.metrics["loss"])
            assert set(update.state) == set(initial)
            assert update.extra  # SCAFFOLD's control-variate delta goes up with the update
        assert learner.memory  # c_i kept for the next round
        state = learner.state
        assert (state.rounds_done, state.round, state.history) == (2, 1, [0, 1])
        changed = [k for k in initial if not np.array_equal(initial[k], update.state[k])]
        assert changed


class MemorySequence(Sequence):
    """A simulation client's sequence over given frames."""

    def __init__(self, name: str, items: list[Frame]) -> None:
        super().__init__(name, SequenceMeta("car", "urban_day", "test", "train"))
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def _frame(self, i: int) -> Frame:
        return self.items[i]


def _states_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        np.array_equal(a[k], b[k]) and np.asarray(a[k]).dtype == np.asarray(b[k]).dtype for k in a
    )


def test_the_learner_and_the_simulation_give_identical_weights(tmp_path: Path) -> None:
    """The robot and a simulated client train one task on the same frames (the robot's partly
    spilled to disk, the simulation's as two sequences) into exactly the same update, round
    after round, hook memory included."""
    recipe = TrainRecipe(
        local_steps=4,
        batch_size=3,
        lr=1e-3,
        schedule="cosine",
        warmup_steps=1,
        image_size=(16, 32),  # the frames are 24 x 32: resized
        flip=True,
        seed=11,
    )
    data = frames(7)
    cid = "robot-x"
    model = create_model("regression-lite", min_depth=0.1, max_depth=10.0)
    state = get_state(model)
    sim_config = SimConfig(model="regression-lite", min_depth=0.1, max_depth=10.0)
    sim_model = sim_config.build_model()
    sequences = [MemorySequence("a", data[:3]), MemorySequence("b", data[3:])]
    with FrameBuffer(4, spill_dir=tmp_path / "spill", spill_capacity=4) as buffer:
        for f in data:
            buffer.push(f)
        assert buffer.flush() and len(buffer) == 7
        learner = BufferLearner(cid, model, buffer, LearnerConfig(device="cpu"))
        sim_memory: dict = {}
        for rnd in (0, 1):
            task = TrainTask(state=state, hook="scaffold", recipe=recipe)
            robot = learner.train(rnd, task)
            job = ClientJob(cid, sequences, task, sim_memory, rnd=rnd)
            sim = run_job(sim_config, job, sim_model)
            sim_memory = sim.memory
            assert _states_equal(dict(robot.state), dict(sim.update.state))
            assert robot.extra.keys() == sim.update.extra.keys()
            for group in robot.extra:
                assert _states_equal(dict(robot.extra[group]), dict(sim.update.extra[group]))
            assert robot.metrics == sim.update.metrics
            assert (robot.num_samples, robot.num_steps) == (7, 4)
            assert _states_equal(learner.memory[CLIENT_CONTROL], sim_memory[CLIENT_CONTROL])
            state = dict(robot.state)


def test_the_coordinators_recipe_wins_and_the_fallback_warns_once() -> None:
    model = create_model("regression-lite", min_depth=0.1, max_depth=10.0)
    initial = get_state(model)
    with FrameBuffer(8) as buffer:
        for f in frames(5):
            buffer.push(f)
        warnings: list[str] = []
        config = LearnerConfig(local_steps=1, batch_size=2, lr=1e-3, device="cpu")
        learner = BufferLearner("robot-y", model, buffer, config, warn=warnings.append)
        sent = TrainRecipe(local_steps=3, batch_size=2, image_size=(16, 16))
        update = learner.train(0, TrainTask(state=initial, recipe=sent))
        assert update.num_steps == 3 and learner.state.recipe == "coordinator"
        assert warnings == []
        for rnd in (1, 2):
            update = learner.train(rnd, TrainTask(state=initial))
            assert update.num_steps == 1 and learner.state.recipe == "local"
        assert len(warnings) == 1 and "sent no training recipe" in warnings[0]
        assert "local_steps=1" in warnings[0] and "image_size=24x32" in warnings[0]
    # the fallback: these settings at the configured size, or the frames' own
    assert config.fallback_recipe((24, 32)) == TrainRecipe(
        local_steps=1, batch_size=2, lr=1e-3, image_size=(24, 32)
    )
    sized = LearnerConfig(image_size=(12, 16), seed=4).fallback_recipe((24, 32))
    assert sized.image_size == (12, 16) and sized.seed == 4


def test_predictor_clips_to_the_depth_range_and_keeps_nan_for_invalid() -> None:
    predictor = DepthPredictor(
        create_model("regression-lite", min_depth=0.5, max_depth=2.0), resolve_device("cpu")
    )
    depth = predictor.predict(frames(1)[0].rgb)
    assert depth.shape == (24, 32) and depth.dtype == np.float32
    assert np.isfinite(depth).all() and depth.min() >= 0.5 and depth.max() <= 2.0
    assert predictor.gem(frames(1)[0].rgb).ndim == 1
    with torch.no_grad():
        for p in predictor.model.parameters():
            p.fill_(float("nan"))
    assert np.isnan(predictor.predict(frames(1)[0].rgb)).all()
