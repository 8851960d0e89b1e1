"""The robot's federated client without ROS: descriptor and local rounds over its frame buffer.

:class:`BufferLearner` is what ``robot_node``'s worker thread runs: the descriptor of sampled
buffered frames (frozen encoder -> GeM -> mean/variance), and per round
:func:`fedepth.client.train_round` (the function every simulated and benchmark client runs) on
the frames buffered so far, with the training recipe the coordinator sent in the task.
:class:`DepthPredictor` is the live inference of ``depth_node``.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from fedepth.client import train_round
from fedepth.clustering import subspace_basis
from fedepth.data.sequence import Frame
from fedepth.data.torchdata import descriptor_rgb, resize_rgb
from fedepth.descriptor import Descriptor, DescriptorExtractor, gem_descriptor, image_to_tensor
from fedepth.models import (
    CheckpointError,
    DepthModel,
    ModelCard,
    card_of,
    load_model,
    read_card,
    set_state,
)
from fedepth.models.state import State
from fedepth.recipe import TrainRecipe
from fedepth.strategies import ClientUpdate, TrainTask
from fedepth.strategies.pacfl import BASIS_KEY, BASIS_SIZE
from fedepth_ros.params import ROBOT_NODE
from fedepth_ros.sync import FrameBuffer


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
    basis = subspace_basis(np.asarray(gem_vectors).T, BASIS_SIZE)
    return gem_descriptor(gem_vectors), {BASIS_KEY: basis}


def model_from_weights(weights: str) -> DepthModel:
    """The model ``weights``' card describes, with the weights loaded (one-line ValueError for a
    file without a card: there is no model or depth range parameter to fall back on)."""
    if read_card(weights) is None:
        raise ValueError(
            f"weights {weights} have no model card, so the node cannot tell which model they "
            "are: re-save them with fedepth.models.save_weights (fedepth pretrain does)"
        )
    model = load_model(weights)
    assert isinstance(model, DepthModel)
    return model


def model_from_card(card_json: str | None, source: str) -> DepthModel:
    """A fresh model as the served card (JSON) describes it; a one-line ValueError without a
    card, or when the card's encoder checkpoint is missing or different here (the node
    refuses a model it cannot reproduce)."""
    if not card_json:
        raise ValueError(
            f"{source} serves a model without a card (the synthetic test model): no depth "
            "network can be built from it; serve a registry model (model.name) or set weights"
        )
    card = ModelCard.from_json(card_json, source)
    try:
        model = card.build()
    except CheckpointError as exc:
        raise CheckpointError(f"{source} serves {card.describe()}, refused here: {exc}") from None
    assert isinstance(model, DepthModel)
    return model


def initial_model(card_json: str | None, state: State, source: str) -> DepthModel:
    """The served model (its card, JSON) holding the run's initial weights ``state``: the
    frozen encoder every descriptor of the run is computed with (FeDepth Sec. 3.3). A node
    without weights of its own describes its frames with it; a freshly initialized model
    would describe them with an encoder no other robot used, so its divergences, clusters
    and routes would be noise."""
    model = model_from_card(card_json, source)
    set_state(model, state, source=f"{source}'s initial model")
    return model


def check_served(model: DepthModel, card_json: str | None, source: str) -> None:
    """Raise a one-line ValueError unless ``model`` is the one ``source`` serves."""
    mine = card_of(model)
    if not card_json:
        raise ValueError(
            f"the local model is {mine.describe()}, but {source} serves a model without a card"
        )
    served = ModelCard.from_json(card_json, source)
    diff = served.differences(mine)
    if diff:
        raise ValueError(
            f"the local model is {mine.describe()}, but {source} serves {served.describe()} "
            f"(differs in {', '.join(diff)})"
        )


def set_threads(threads: int) -> int:
    """``torch.set_num_threads(threads)`` when > 0 (0: torch's default); the count in use."""
    if threads < 0:
        raise ValueError(f"threads must be >= 0, got {threads}")
    if threads > 0:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


log = logging.getLogger(__name__)
_RECIPE = TrainRecipe()


@dataclass
class LearnerConfig:
    """A robot's learner settings (robot_node parameters).

    Local to the robot: ``device``, ``descriptor_frames`` and ``image_size``, the input size of
    the descriptor (None: frames as taken). ``local_steps``, ``batch_size``, ``lr``
    (and ``image_size``, ``seed``) are only the FALLBACK recipe, for a coordinator that sends
    none (:meth:`fallback_recipe`); a task's recipe always wins.
    """

    local_steps: int = _RECIPE.local_steps
    batch_size: int = _RECIPE.batch_size
    lr: float = _RECIPE.lr
    descriptor_frames: int = ROBOT_NODE["descriptor_frames"][0]
    image_size: tuple[int, int] | None = None
    device: str = "auto"
    seed: int = 0

    def fallback_recipe(self, frame_size: tuple[int, int]) -> TrainRecipe:
        """The recipe of a round whose task has none: these settings, the recipe's defaults
        otherwise, at ``image_size`` (None: ``frame_size``, the buffered frames' size)."""
        return TrainRecipe(
            local_steps=self.local_steps,
            batch_size=self.batch_size,
            lr=self.lr,
            image_size=self.image_size or frame_size,
            seed=self.seed,
        )


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
    #: where the last round's recipe came from: "coordinator", "local" (fallback), None yet
    recipe: str | None = None


class BufferLearner:
    """One robot's client side: descriptor and local rounds on the frames of a buffer.

    ``model`` may be None until the coordinator's card is known (:meth:`set_model`).

    ``warn`` receives the one warning a learner gives when a coordinator sends no recipe
    (default: this module's logger; ``robot_node`` passes its ROS logger).
    """

    def __init__(
        self,
        robot_id: str,
        model: DepthModel | None,
        buffer: FrameBuffer,
        config: LearnerConfig,
        *,
        warn: Callable[[str], object] | None = None,
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
        self._warn = warn or log.warning
        self._warned = False

    def set_model(self, model: DepthModel) -> None:
        self.model = model

    def _model(self) -> DepthModel:
        if self.model is None:
            raise ValueError("no model yet: the served model's card has not arrived")
        return self.model

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
            # as the benchmark describes its clients (fedepth.sim.prepare_fleet)
            return descriptor_rgb(frame.rgb, size) if size else image_to_tensor(frame.rgb)

        model = self._model().to(self.device)
        extractor = DescriptorExtractor(
            model.forward_features,
            num_frames=len(frames),
            seed=self.config.seed,
            device=self.device,
        )
        descriptor, self.summaries = describe(extractor.per_frame(frames, to_tensor=to_tensor))
        self._update(descriptor_frames=descriptor.num_frames, phase="joined")
        return descriptor

    def train(self, rnd: int, task: TrainTask) -> ClientUpdate:
        """One federated round: the downloaded task trained on the buffered frames (oldest
        first) with :func:`fedepth.client.train_round`, the task's recipe and this robot's id
        for the seed; the fallback recipe (with one warning) when the task has none."""
        self._update(round=rnd, phase="training")
        frames = self._frames(len(self.buffer))
        if not frames:
            raise ValueError("the frame buffer is empty: nothing to train on")
        fallback = None
        if task.recipe is None:
            fallback = self.config.fallback_recipe(frames[0].size)
            if not self._warned:
                self._warned = True
                self._warn(
                    f"robot {self.robot_id}: the coordinator sent no training recipe; training "
                    f"with the local fallback (local_steps={fallback.local_steps}, batch_size="
                    f"{fallback.batch_size}, lr={fallback.lr:g}, image_size="
                    f"{fallback.image_size[0]}x{fallback.image_size[1]})"
                )
        result = train_round(
            self._model(),
            task,
            frames,
            cid=self.robot_id,
            rnd=rnd,
            memory=self.memory,
            fallback=fallback,
            device=str(self.device),
        )
        self.memory = result.memory
        self._update(
            rounds_done=self.state.rounds_done + 1,
            last_loss=result.update.metrics["loss"],
            last_train_s=result.seconds,
            phase="uploading",
            history=[*self.state.history, rnd],
            recipe="local" if fallback is not None else "coordinator",
        )
        return result.update

    def set_phase(self, phase: str) -> None:
        self._update(phase=phase)


class DepthPredictor:
    """Inference of one model: (H, W, 3) uint8 RGB -> (H, W) float32 metres, NaN = invalid.

    With ``resize`` and a model whose card has an input size, frames are resized to it first
    (as training and the benchmark's evaluation resize them: bilinear, anti-aliased when
    shrinking) and the depth is resized back to the frame's size (bilinear); the routing
    descriptor and drift vectors are computed at that size too.
    """

    def __init__(self, model: DepthModel, device: torch.device, *, resize: bool = False) -> None:
        self.model = model.to(device).eval()
        self.device = device
        self.min_depth = float(model.min_depth)
        self.max_depth = float(model.max_depth)
        self.size: tuple[int, int] | None = model.input_size if resize else None

    def clone(self) -> DepthPredictor:
        """An independent predictor with a copy of this one's weights."""
        twin = copy.copy(self)
        twin.model = copy.deepcopy(self.model)
        return twin

    def load_state(self, state: State, source: str) -> None:
        set_state(self.model, state, source=source)
        self.model.eval()

    def to_tensor(self, rgb: np.ndarray) -> torch.Tensor:
        """(3, h, w) float input of one frame: at the card's size when resizing."""
        if self.size is None:
            return image_to_tensor(rgb)
        return resize_rgb(rgb, self.size)

    def descriptor_tensor(self, rgb: np.ndarray) -> torch.Tensor:
        """(3, h, w) encoder input of a frame for descriptors (routing, drift): at the card's
        size when resizing, resized as the benchmark describes frames."""
        if self.size is None:
            return image_to_tensor(rgb)
        return descriptor_rgb(rgb, self.size)

    def predict(self, rgb: np.ndarray) -> np.ndarray:
        x = self.to_tensor(rgb)[None].to(self.device)
        with torch.inference_mode():
            out = self.model(x)
            if tuple(out.shape[-2:]) != tuple(rgb.shape[:2]):
                out = torch.nn.functional.interpolate(
                    out.float(), size=rgb.shape[:2], mode="bilinear", align_corners=False
                )
            depth = out[0, 0].float().cpu().numpy()
        out_np = np.clip(depth, self.min_depth, self.max_depth).astype(np.float32)
        out_np[~np.isfinite(depth)] = np.nan
        return out_np

    def gem(self, rgb: np.ndarray) -> np.ndarray:
        """The GeM vector (C,) of one RGB frame under this model's encoder (drift watching)."""
        extractor = DescriptorExtractor(self.model.forward_features, device=self.device)
        return extractor.pooled(self.descriptor_tensor(rgb)[None]).numpy()[0].astype(np.float64)

    def features(
        self, frames: Sequence[np.ndarray], num_frames: int, seed: int
    ) -> tuple[Descriptor, dict[str, np.ndarray]]:
        """The descriptor (and summaries, see :func:`describe`) of RGB frames under this
        model's frozen encoder."""
        extractor = DescriptorExtractor(
            self.model.forward_features, num_frames=num_frames, seed=seed, device=self.device
        )
        return describe(extractor.per_frame(frames, to_tensor=self.descriptor_tensor))
