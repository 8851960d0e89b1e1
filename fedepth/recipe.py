"""TrainRecipe: how every client trains a federated round, sent by the driver with each task.

One recipe says everything that decides a client's local round apart from its data and the
downloaded weights: local steps and batch size, optimizer, learning rate and its schedule
within the round, gradient clipping, the input size frames are resized to, flip augmentation
the run's base seed, and the SILog loss's lambda. The round driver puts it in every
:class:`~fedepth.strategies.TrainTask` (the simulation from its ``SimConfig``, the
coordinator from its ``training:`` section, over the wire in the download header), and
:func:`fedepth.client.train_round` trains with it, so a simulated client, a benchmark robot
process and a deployed ``robot_node`` given the same task and frames compute the same update.

What stays local to a machine is not in it: the device, torch threads, the descriptor's frames.
Its defaults are the project's one source of the training recipe's defaults: the simulation
(:class:`fedepth.sim.SimConfig`), the coordinator's ``training:`` section and a robot's fallback
recipe (``robot_node``'s parameters) take theirs from it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from fedepth.optconfig import OPTIMIZERS, SCHEDULES, OptimizerConfig, TrainConfig

_INT64 = 1 << 63
_OPTIMIZER = OptimizerConfig()


def client_seed(seed: int, rnd: int, cid: str) -> int:
    """The training seed of client ``cid`` in round ``rnd`` of a run with base ``seed``.

    ``crc32(f"{seed}/{rnd}/{cid}")``: independent of execution order and of the other clients,
    different for every client and round. It seeds batch order, flips and model randomness.
    """
    return int(zlib.crc32(f"{seed}/{rnd}/{cid}".encode()))


#: Learning-rate schedules ACROSS the rounds of a run (:func:`round_lr`); the recipe's own
#: ``schedule`` is the one within a round's local steps.
ROUND_SCHEDULES = ("constant", "cosine")


def round_lr(lr: float, rnd: int, num_rounds: int, schedule: str, final_fraction: float) -> float:
    """The learning rate of round ``rnd`` (0-based) of ``num_rounds``: ``lr`` throughout
    (``constant``), or ``cosine`` from ``lr`` in round 0 to ``lr * final_fraction`` in the
    last round. The driver puts it in the round's recipe, so robots need to know nothing of
    the schedule."""
    if schedule not in ROUND_SCHEDULES:
        raise ValueError(
            f"unknown round schedule {schedule!r}; known: {', '.join(ROUND_SCHEDULES)}"
        )
    if not 0 <= final_fraction <= 1:
        raise ValueError(f"final lr fraction must lie in [0, 1], got {final_fraction!r}")
    if schedule == "constant" or num_rounds <= 1:
        return lr
    t = min(max(rnd, 0), num_rounds - 1) / (num_rounds - 1)
    return lr * (final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * t)))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class TrainRecipe:
    """The client side of a round, as the driver prescribes it (frozen; validated).

    ``schedule`` is the learning-rate schedule WITHIN the ``local_steps`` of one round
    (``constant``, or ``cosine`` decaying to ``lr * final_lr_fraction`` at the last step),
    after ``warmup_steps`` of linear warmup (see
    :meth:`fedepth.optconfig.OptimizerConfig.step_lrs`). ``grad_clip`` is a max global gradient
    norm (None: no clipping); ``momentum`` applies to ``sgd`` only. ``image_size`` is (H, W):
    every frame is resized to it (bilinear RGB, nearest depth); ``flip`` mirrors frames
    left-right with probability 1/2. ``seed`` is the run's base seed: client ``cid`` trains
    round ``rnd`` with :meth:`round_seed`.
    """

    local_steps: int = 5
    batch_size: int = 4
    # the optimizer's defaults are those of fedepth.optconfig.OptimizerConfig
    optimizer: Literal["adamw", "adam", "sgd"] = _OPTIMIZER.name
    lr: float = _OPTIMIZER.lr
    weight_decay: float = _OPTIMIZER.weight_decay
    momentum: float = _OPTIMIZER.momentum
    grad_clip: float | None = _OPTIMIZER.grad_clip
    schedule: Literal["constant", "cosine"] = _OPTIMIZER.schedule
    warmup_steps: int = _OPTIMIZER.warmup_steps
    final_lr_fraction: float = _OPTIMIZER.final_lr_fraction
    image_size: tuple[int, int] = (48, 64)
    flip: bool = True
    seed: int = 0
    #: lambda of the SILog loss (None: the model's own, 0.85); lower weighs global scale more
    variance_focus: float | None = None

    def __post_init__(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise ValueError(f"TrainRecipe: {what}")

        for name in ("local_steps", "batch_size"):
            value = getattr(self, name)
            need(_is_int(value) and value > 0, f"{name} must be an integer > 0, got {value!r}")
        need(
            self.optimizer in OPTIMIZERS,
            f"unknown optimizer {self.optimizer!r}; known: {', '.join(OPTIMIZERS)}",
        )
        need(_is_number(self.lr) and self.lr > 0, f"lr must be a number > 0, got {self.lr!r}")
        need(
            _is_number(self.weight_decay) and self.weight_decay >= 0,
            f"weight_decay must be a number >= 0, got {self.weight_decay!r}",
        )
        need(
            _is_number(self.momentum) and 0 <= self.momentum < 1,
            f"momentum must lie in [0, 1), got {self.momentum!r}",
        )
        need(
            self.grad_clip is None or (_is_number(self.grad_clip) and self.grad_clip > 0),
            f"grad_clip must be a number > 0 or None, got {self.grad_clip!r}",
        )
        need(
            self.schedule in SCHEDULES,
            f"unknown schedule {self.schedule!r}; known: {', '.join(SCHEDULES)}",
        )
        need(
            _is_int(self.warmup_steps) and 0 <= self.warmup_steps < self.local_steps,
            f"warmup_steps must be an integer in [0, local_steps) = [0, {self.local_steps}), "
            f"got {self.warmup_steps!r}",
        )
        need(
            _is_number(self.final_lr_fraction) and 0 <= self.final_lr_fraction <= 1,
            f"final_lr_fraction must lie in [0, 1], got {self.final_lr_fraction!r}",
        )
        size = tuple(self.image_size) if isinstance(self.image_size, list | tuple) else ()
        need(
            len(size) == 2 and all(_is_int(v) and v > 0 for v in size),
            f"image_size must be (H, W) with two integers > 0, got {self.image_size!r}",
        )
        object.__setattr__(self, "image_size", (int(size[0]), int(size[1])))
        need(isinstance(self.flip, bool), f"flip must be true or false, got {self.flip!r}")
        need(
            _is_int(self.seed) and -_INT64 <= self.seed < _INT64,
            f"seed must be a 64-bit integer, got {self.seed!r}",
        )
        need(
            self.variance_focus is None
            or (_is_number(self.variance_focus) and 0 <= self.variance_focus <= 1),
            f"variance_focus must lie in [0, 1] or be None, got {self.variance_focus!r}",
        )
        if self.variance_focus is not None:
            object.__setattr__(self, "variance_focus", float(self.variance_focus))
        for name in ("lr", "weight_decay", "momentum", "final_lr_fraction"):
            object.__setattr__(self, name, float(getattr(self, name)))
        if self.grad_clip is not None:
            object.__setattr__(self, "grad_clip", float(self.grad_clip))

    def round_seed(self, rnd: int, cid: str) -> int:
        """The training seed of client ``cid`` in round ``rnd`` (see :func:`client_seed`)."""
        return client_seed(self.seed, rnd, cid)

    def optimizer_config(self) -> OptimizerConfig:
        return OptimizerConfig(
            name=self.optimizer,
            lr=self.lr,
            weight_decay=self.weight_decay,
            momentum=self.momentum,
            grad_clip=self.grad_clip,
            schedule=self.schedule,
            warmup_steps=self.warmup_steps,
            final_lr_fraction=self.final_lr_fraction,
        )

    def train_config(self, seed: int, *, device: str | None = None) -> TrainConfig:
        """The :class:`~fedepth.optconfig.TrainConfig` of one round trained with ``seed``."""
        return TrainConfig(
            num_steps=self.local_steps,
            batch_size=self.batch_size,
            optimizer=self.optimizer_config(),
            seed=seed,
            device=device,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON- and YAML-friendly: plain numbers, strings, booleans, ``image_size`` a list."""
        out = asdict(self)
        out["image_size"] = list(self.image_size)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainRecipe:
        """The recipe of :meth:`to_dict`'s mapping; missing keys take the defaults, unknown
        keys are an error that names them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"TrainRecipe: unknown key(s) {', '.join(map(str, unknown))}; "
                f"known: {', '.join(sorted(known))}"
            )
        return cls(**dict(data))
