"""LocalTrainer: a fixed number of local steps on one client's data, with FL algorithm hooks.

Every client runs exactly ``num_steps`` optimizer steps of ``batch_size`` samples per round,
whatever its data size (a client with more data does not do more compute; its size only weighs
its update in aggregation). Batches are drawn from a seeded stream of permutations of the
dataset (a client smaller than a batch repeats samples), so a run is reproducible: same seed,
data and initial state give the same result on CPU. CUDA with mixed precision (bfloat16 where
supported, else float16 with loss scaling) is used when present, CPU otherwise.

The trainer talks to the model only through the shared contract ``forward_train(rgb)`` and
``loss(out, gt, valid)``, and to FL algorithms only through :class:`TrainHook`. The optimizer
is created afresh every :meth:`LocalTrainer.fit` (local optimizer state does not persist across
rounds), and its learning-rate schedule (:class:`OptimizerConfig`) runs over that fit's steps.
BatchNorm layers train in train mode, so their running statistics move with the local data and
travel in the returned state (see ``fedepth.models.state``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

from fedepth.losses import valid_mask
from fedepth.models.base import DepthModel
from fedepth.models.state import State, get_state, set_state

# the settings live in a torch-free module (fedepth.recipe and the ROS parameter tables use
# them without loading torch); re-exported here, where the trainer that uses them is
from fedepth.optconfig import OPTIMIZERS as OPTIMIZERS
from fedepth.optconfig import SCHEDULES as SCHEDULES
from fedepth.optconfig import OptimizerConfig as OptimizerConfig
from fedepth.optconfig import TrainConfig as TrainConfig

ExtraStates = dict[str, dict[str, np.ndarray]]


@dataclass
class TrainResult:
    """Outcome of one local round.

    ``num_samples`` is the client's dataset size (its aggregation weight; for an iterable
    dataset without a length, the samples seen); ``losses`` the optimised objective at every
    step; ``terms`` the mean of each loss term over the steps; ``extra`` what the hooks return.
    """

    state: dict[str, np.ndarray]
    num_steps: int
    num_samples: int
    samples_seen: int
    losses: list[float]
    terms: dict[str, float]
    extra: ExtraStates
    seconds: float


@runtime_checkable
class TrainHook(Protocol):
    """The points at which an FL algorithm acts on local training.

    * ``on_train_start(model, lr=, num_steps=)``: the model holds the downloaded (global)
      weights; snapshot what the algorithm needs. ``lr`` is the mean learning rate of the
      round's steps (exactly the configured ``lr`` under a constant schedule without warmup),
      so ``num_steps * lr`` is the total step size SCAFFOLD's control update divides by.
    * ``regularizer(model)``: a scalar tensor added to the loss at every step, or ``None``.
    * ``after_backward(model)``: after gradients are computed (and unscaled), before clipping
      and the optimizer step; may modify ``p.grad`` (gradient correction).
    * ``on_train_end(model, num_steps)``: after the last step; returns named extra numpy states
      (e.g. SCAFFOLD's control-variate delta) for :attr:`TrainResult.extra`.
    """

    def on_train_start(self, model: nn.Module, *, lr: float, num_steps: int) -> None: ...

    def regularizer(self, model: nn.Module) -> torch.Tensor | None: ...

    def after_backward(self, model: nn.Module) -> None: ...

    def on_train_end(self, model: nn.Module, num_steps: int) -> ExtraStates: ...


class BaseHook:
    """A :class:`TrainHook` that does nothing; subclasses override the points they need."""

    def on_train_start(self, model: nn.Module, *, lr: float, num_steps: int) -> None:
        return None

    def regularizer(self, model: nn.Module) -> torch.Tensor | None:
        return None

    def after_backward(self, model: nn.Module) -> None:
        return None

    def on_train_end(self, model: nn.Module, num_steps: int) -> ExtraStates:
        return {}


def trainable_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """Name -> parameter for the parameters that require gradients (what the hooks cover)."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def step_batches(num_items: int, batch_size: int, num_steps: int, seed: int) -> list[list[int]]:
    """Indices of ``num_steps`` batches of exactly ``batch_size`` from seeded permutations."""
    if num_items <= 0:
        raise ValueError("the client dataset is empty")
    rng = np.random.default_rng(seed)
    need = batch_size * num_steps
    chunks, have = [], 0
    while have < need:
        chunks.append(rng.permutation(num_items))
        have += num_items
    flat = np.concatenate(chunks)[:need]
    return [flat[i * batch_size : (i + 1) * batch_size].tolist() for i in range(num_steps)]


def _cycle(loader: DataLoader[Any]) -> Iterator[Any]:
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("the client dataset yielded no samples")


class LocalTrainer:
    """Runs local rounds of a :class:`~fedepth.models.base.DepthModel` on a client's data.

    The dataset yields ``(rgb, depth)``: rgb (3, H, W) float in [0, 1], depth (1, H, W) in
    meters with 0 (or any value outside the model's depth range) marking invalid pixels.
    """

    def __init__(self, model: DepthModel, *, config: TrainConfig | None = None) -> None:
        self.config = config or TrainConfig()
        if self.config.num_steps <= 0 or self.config.batch_size <= 0:
            raise ValueError("num_steps and batch_size must be > 0")
        #: the learning rate of every local step (validates the schedule)
        self.step_lrs = self.config.optimizer.step_lrs(self.config.num_steps)
        dev = self.config.device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.device = torch.device(dev)
        self.model = model.to(self.device)
        cuda = self.device.type == "cuda"
        self.amp_dtype: torch.dtype | None = None
        if cuda and self.config.amp:
            self.amp_dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16

    def _batches(
        self, dataset: Dataset[Any] | Iterable[Any], seed: int
    ) -> tuple[Iterator[Any], int | None]:
        cfg = self.config
        pin = self.device.type == "cuda"
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
            loader: DataLoader[Any] = DataLoader(
                dataset,  # type: ignore[arg-type]
                batch_size=cfg.batch_size,
                num_workers=cfg.num_workers,
                pin_memory=pin,
            )
            size = len(dataset) if hasattr(dataset, "__len__") else None  # type: ignore[arg-type]
            return _cycle(loader), size
        size = len(dataset)  # type: ignore[arg-type]
        sampler = step_batches(size, cfg.batch_size, cfg.num_steps, seed)
        loader = DataLoader(
            dataset,  # type: ignore[arg-type]
            batch_sampler=sampler,
            num_workers=cfg.num_workers,
            pin_memory=pin,
        )
        return iter(loader), size

    def _to_device(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(batch, list | tuple) or len(batch) != 2:
            raise ValueError("the dataset must yield (rgb, depth) pairs")
        if not torch.as_tensor(batch[0]).is_floating_point():
            raise ValueError("rgb must be float in [0, 1] (convert uint8 images by / 255)")
        rgb = torch.as_tensor(batch[0]).to(self.device, non_blocking=True).float()
        gt = torch.as_tensor(batch[1]).to(self.device, non_blocking=True).float()
        if gt.ndim == 3:
            gt = gt.unsqueeze(1)
        if rgb.ndim != 4 or rgb.shape[1] != 3 or gt.shape != (rgb.shape[0], 1, *rgb.shape[2:]):
            raise ValueError(
                f"expected rgb (B, 3, H, W) and depth (B, 1, H, W), got {tuple(rgb.shape)} and "
                f"{tuple(gt.shape)}"
            )
        return rgb, gt

    def fit(
        self,
        dataset: Dataset[Any] | Iterable[Any],
        *,
        state: State | None = None,
        hooks: Sequence[TrainHook] = (),
        seed: int | None = None,
        on_step: Callable[[int, float], None] | None = None,
    ) -> TrainResult:
        """One local round: load ``state`` (if given), run ``num_steps`` steps, return the result.

        ``seed`` (default: the config's) fixes batch order and any randomness in the model.
        ``on_step(step, loss)``, when given, is called after every optimizer step (step index
        from 0, the optimised objective), e.g. to show the progress of a long fit.
        """
        cfg = self.config
        seed = cfg.seed if seed is None else seed
        model = self.model
        if state is not None:
            set_state(model, state)
        was_training = model.training
        start = time.perf_counter()
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            batches, size = self._batches(dataset, seed)
            losses, sums = self._run(model, batches, hooks, on_step)
        extra: ExtraStates = {}
        for hook in hooks:
            extra.update(hook.on_train_end(model, cfg.num_steps))
        model.train(was_training)
        seen = cfg.num_steps * cfg.batch_size
        return TrainResult(
            state=get_state(model),
            num_steps=cfg.num_steps,
            num_samples=size if size is not None else seen,
            samples_seen=seen,
            losses=losses,
            terms={k: v / cfg.num_steps for k, v in sums.items()},
            extra=extra,
            seconds=time.perf_counter() - start,
        )

    def _run(
        self,
        model: DepthModel,
        batches: Iterator[Any],
        hooks: Sequence[TrainHook],
        on_step: Callable[[int, float], None] | None = None,
    ) -> tuple[list[float], dict[str, float]]:
        cfg = self.config
        params = trainable_parameters(model)
        optimizer = cfg.optimizer.build(params.values())
        scaler = torch.amp.GradScaler("cuda", enabled=self.amp_dtype == torch.float16)
        scheduled = cfg.optimizer.scheduled
        # constant without warmup: the optimizer keeps its lr (bit-identical to no schedule)
        mean_lr = sum(self.step_lrs) / cfg.num_steps if scheduled else cfg.optimizer.lr
        for hook in hooks:
            hook.on_train_start(model, lr=mean_lr, num_steps=cfg.num_steps)
        model.train()
        losses: list[float] = []
        sums: dict[str, float] = {}
        for step in range(cfg.num_steps):
            rgb, gt = self._to_device(next(batches))
            if scheduled:
                for group in optimizer.param_groups:
                    group["lr"] = self.step_lrs[step]
            optimizer.zero_grad(set_to_none=True)
            autocast = (
                torch.autocast(device_type="cuda", dtype=self.amp_dtype)
                if self.amp_dtype is not None
                else contextlib.nullcontext()
            )
            with autocast:
                out = model.forward_train(rgb)
            loss, terms = model.loss(out, gt, valid_mask(gt, model.min_depth, model.max_depth))
            total = loss
            for hook in hooks:
                reg = hook.regularizer(model)
                if reg is not None:
                    total = total + reg
                    terms["regularizer"] = terms.get("regularizer", 0.0) + float(reg.detach())
            if not torch.isfinite(total):
                raise FloatingPointError(
                    f"non-finite loss {float(total.detach())} at local step {step}"
                )
            scaler.scale(total).backward()
            scaler.unscale_(optimizer)
            for hook in hooks:
                hook.after_backward(model)
            if cfg.optimizer.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(list(params.values()), cfg.optimizer.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            losses.append(float(total.detach()))
            for k, v in terms.items():
                sums[k] = sums.get(k, 0.0) + v
            if on_step is not None:
                on_step(step, losses[-1])
        return losses, sums


def param_tensors(
    params: Mapping[str, nn.Parameter], state: State | None, *, what: str
) -> dict[str, torch.Tensor]:
    """A numpy state over the trainable parameters as float tensors beside them (zeros if None).

    Used by hooks for control variates and gradient states; names and shapes must match
    ``params`` exactly (``what`` names the state in errors).
    """
    out: dict[str, torch.Tensor] = {}
    if state is not None:
        extra = sorted(set(state) - set(params))
        missing = sorted(set(params) - set(state))
        if extra or missing:
            raise ValueError(
                f"{what} does not match the trainable parameters: "
                f"missing {missing[:5]}, unexpected {extra[:5]}"
            )
    for name, p in params.items():
        if state is None:
            out[name] = torch.zeros_like(p, dtype=torch.float32)
            continue
        arr = np.asarray(state[name])
        if arr.shape != tuple(p.shape):
            raise ValueError(
                f"{what}: tensor {name!r} has shape {arr.shape}, parameter is {tuple(p.shape)}"
            )
        out[name] = torch.as_tensor(arr, dtype=torch.float32, device=p.device).clone()
    return out


def snapshot(params: Mapping[str, nn.Parameter]) -> dict[str, torch.Tensor]:
    """Detached float32 copies of parameters (e.g. the global weights at the start of a round)."""
    return {n: p.detach().float().clone() for n, p in params.items()}


def to_numpy(tensors: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Host numpy copies of a dict of tensors."""
    return {n: t.detach().cpu().numpy().copy() for n, t in tensors.items()}
