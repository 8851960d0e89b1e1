"""The robot's federated client without ROS: descriptor and local rounds over its frame buffer.

:class:`BufferLearner` is what ``robot_node``'s worker thread runs: the descriptor of sampled
buffered frames (frozen encoder -> GeM -> mean/variance), and per round the same steps as
:func:`fedepth.sim.run_job` (LocalTrainer + the strategy's client hook with its memory) on the
frames buffered so far. :class:`DepthPredictor` is the live inference of ``depth_node``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from fedepth.clustering import subspace_basis
from fedepth.data.sequence import Frame
from fedepth.data.torchdata import resize_frame
from fedepth.descriptor import Descriptor, DescriptorExtractor, image_to_tensor
from fedepth.models import DepthModel, create_model, load_weights, set_state
from fedepth.strategies import ClientUpdate, TrainTask, make_client_hook
from fedepth.strategies.aggregate import State
from fedepth.strategies.pacfl import BASIS_KEY
from fedepth.training import LocalTrainer, OptimizerConfig, TrainConfig
from fedepth_ros.drift import window_descriptor
from fedepth_ros.sync import FrameBuffer

#: PACFL subspace dimension sent with every descriptor (SimConfig.pacfl_basis).
PACFL_BASIS = 3


def resolve_device(name: str) -> torch.device:
    """``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``; clear error otherwise."""
    name = name.strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name != "cpu" and not name.startswith("cuda"):
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {name!r}")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but CUDA is not available here")
    try:
        return torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"device {name!r}: {exc}") from None


def describe(gem_vectors: np.ndarray) -> tuple[Descriptor, dict[str, np.ndarray]]:
    """Per-frame GeM vectors (n, D) -> the Gaussian descriptor and the summaries a strategy
    may ask for (PACFL's subspace basis), from one encoder pass, as :mod:`fedepth.sim` does."""
    basis = subspace_basis(np.asarray(gem_vectors).T, PACFL_BASIS)
    return window_descriptor(gem_vectors), {BASIS_KEY: basis}


def build_model(name: str, min_depth: float, max_depth: float, weights: str = "") -> DepthModel:
    """A registry model, with ``weights`` (safetensors) loaded strictly when given."""
    model = create_model(name, min_depth=min_depth, max_depth=max_depth)
    if weights:
        load_weights(model, weights)
    return model


class FramesDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Buffered frames as (rgb, depth) training pairs, resized to ``size`` (None: as taken)."""

    def __init__(self, frames: Sequence[Frame], size: tuple[int, int] | None) -> None:
        if not frames:
            raise ValueError("no frames to train on")
        self.frames = frames
        self.size = size

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        frame = self.frames[index]
        return resize_frame(frame, self.size or frame.size)


@dataclass
class LearnerConfig:
    """The training settings of a robot (robot_node parameters)."""

    local_steps: int = 50
    batch_size: int = 4
    learning_rate: float = 1e-4
    descriptor_frames: int = 32
    image_size: tuple[int, int] | None = None
    device: str = "auto"
    seed: int = 0


@dataclass
class LearnerState:
    """What the learner did last (read by the status publisher; replaced, never mutated)."""

    round: int = -1
    rounds_done: int = 0
    last_loss: float | None = None
    last_train_s: float | None = None
    descriptor_frames: int = 0
    phase: str = "buffering"
    history: list[int] = field(default_factory=list)


class BufferLearner:
    """One robot's client side: descriptor and local rounds on the frames of a buffer."""

    def __init__(
        self, robot_id: str, model: DepthModel, buffer: FrameBuffer, config: LearnerConfig
    ) -> None:
        self.robot_id = robot_id
        self.model = model
        self.buffer = buffer
        self.config = config
        self.device = resolve_device(config.device)
        self.memory: dict[str, State] = {}
        self.summaries: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()
        self._state = LearnerState()
        self._rng = np.random.default_rng(config.seed)

    @property
    def state(self) -> LearnerState:
        with self._lock:
            return self._state

    def _update(self, **changes: Any) -> None:
        with self._lock:
            self._state = replace(self._state, **changes)

    def _frames(self, n: int) -> list[Frame]:
        """``n`` buffered frames (from memory or the spill directory) as fedepth Frames."""
        return [
            f if isinstance(f, Frame) else Frame(f.rgb, f.depth, f.K, f.stamp_ns)
            for f in self.buffer.sample(n, self._rng)
        ]

    def descriptor(self) -> Descriptor:
        """The descriptor of ``descriptor_frames`` frames sampled from the buffer (and, in
        ``summaries``, their PACFL subspace basis)."""
        self._update(phase="descriptor")
        frames = self._frames(self.config.descriptor_frames)
        if not frames:
            raise ValueError("the frame buffer is empty: no descriptor")
        size = self.config.image_size

        def to_tensor(frame: Frame) -> torch.Tensor:
            return resize_frame(frame, size)[0] if size else image_to_tensor(frame.rgb)

        self.model.to(self.device)
        extractor = DescriptorExtractor(
            self.model.forward_features,
            num_frames=len(frames),
            seed=self.config.seed,
            device=self.device,
        )
        descriptor, self.summaries = describe(extractor.per_frame(frames, to_tensor=to_tensor))
        self._update(descriptor_frames=descriptor.num_frames, phase="joined")
        return descriptor

    def train(self, rnd: int, task: TrainTask) -> ClientUpdate:
        """One federated round: the downloaded task trained on the buffered frames."""
        self._update(round=rnd, phase="training")
        frames = self._frames(len(self.buffer))
        dataset = FramesDataset(frames, self.config.image_size)
        seed = self.config.seed + rnd
        train_config = TrainConfig(
            num_steps=self.config.local_steps,
            batch_size=min(self.config.batch_size, len(dataset)),
            optimizer=OptimizerConfig(lr=self.config.learning_rate),
            seed=seed,
            device=str(self.device),
        )
        trainer = LocalTrainer(self.model, config=train_config)
        hook = make_client_hook(task, self.memory)
        start = time.perf_counter()
        result = trainer.fit(dataset, state=task.state, hooks=() if hook is None else (hook,))
        if hook is not None:
            hook.remember(self.memory)
        loss = float(np.mean(result.losses))
        self._update(
            rounds_done=self.state.rounds_done + 1,
            last_loss=loss,
            last_train_s=time.perf_counter() - start,
            phase="uploading",
            history=[*self.state.history, rnd],
        )
        return ClientUpdate(
            cid=self.robot_id,
            state=result.state,
            num_samples=result.num_samples,
            num_steps=result.num_steps,
            extra=dict(result.extra),
            metrics={"loss": loss},
        )

    def set_phase(self, phase: str) -> None:
        self._update(phase=phase)


class DepthPredictor:
    """Inference of one model: (H, W, 3) uint8 RGB -> (H, W) float32 metres, NaN = invalid."""

    def __init__(self, model: DepthModel, device: torch.device) -> None:
        self.model = model.to(device).eval()
        self.device = device
        self.min_depth = float(model.min_depth)
        self.max_depth = float(model.max_depth)

    def load_state(self, state: State, source: str) -> None:
        set_state(self.model, state, source=source)
        self.model.eval()

    def predict(self, rgb: np.ndarray) -> np.ndarray:
        x = image_to_tensor(rgb)[None].to(self.device)
        with torch.inference_mode():
            depth = self.model(x)[0, 0].float().cpu().numpy()
        out = np.clip(depth, self.min_depth, self.max_depth).astype(np.float32)
        out[~np.isfinite(depth)] = np.nan
        return out

    def gem(self, rgb: np.ndarray) -> np.ndarray:
        """The GeM vector (C,) of one RGB frame under this model's encoder (drift watching)."""
        extractor = DescriptorExtractor(self.model.forward_features, device=self.device)
        return extractor.pooled(image_to_tensor(rgb)[None]).numpy()[0].astype(np.float64)

    def features(
        self, frames: Sequence[np.ndarray], num_frames: int, seed: int
    ) -> tuple[Descriptor, dict[str, np.ndarray]]:
        """The descriptor (and summaries, see :func:`describe`) of RGB frames under this
        model's frozen encoder."""
        extractor = DescriptorExtractor(
            self.model.forward_features, num_frames=num_frames, seed=seed, device=self.device
        )
        return describe(extractor.per_frame(frames))
