"""BufferLearner and DepthPredictor without ROS: descriptor, local rounds with a client hook,
spilled frames in training, inference range and NaN handling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedepth.data.sequence import Frame
from fedepth.models import get_state
from fedepth.strategies import TrainTask
from fedepth.strategies.pacfl import BASIS_KEY
from fedepth_ros.learner import (
    BufferLearner,
    DepthPredictor,
    FramesDataset,
    LearnerConfig,
    build_model,
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
    model = build_model("regression-lite", 0.1, 10.0)
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


def test_frames_dataset_resizes_and_refuses_empty() -> None:
    rgb, depth = FramesDataset(frames(1), (12, 16))[0]
    assert rgb.shape == (3, 12, 16) and depth.shape == (1, 12, 16)
    assert FramesDataset(frames(1), None)[0][0].shape == (3, 24, 32)
    with pytest.raises(ValueError, match="no frames"):
        FramesDataset([], None)


def test_predictor_clips_to_the_depth_range_and_keeps_nan_for_invalid() -> None:
    predictor = DepthPredictor(build_model("regression-lite", 0.5, 2.0), resolve_device("cpu"))
    depth = predictor.predict(frames(1)[0].rgb)
    assert depth.shape == (24, 32) and depth.dtype == np.float32
    assert np.isfinite(depth).all() and depth.min() >= 0.5 and depth.max() <= 2.0
    assert predictor.gem(frames(1)[0].rgb).ndim == 1
    with torch.no_grad():
        for p in predictor.model.parameters():
            p.fill_(float("nan"))
    assert np.isnan(predictor.predict(frames(1)[0].rgb)).all()
