"""The client side of a federated round: the ONE function that trains every client.

:func:`train_round` is what a simulated client (:func:`fedepth.sim.run_job`, in any executor),
a robot process of the gRPC benchmark and ``robot_node`` (:class:`fedepth_ros.learner.
BufferLearner`) run. It trains the task's model on the client's frames with the task's
:class:`~fedepth.recipe.TrainRecipe`: frames resized to ``recipe.image_size`` and flipped as
``recipe.flip`` says (:class:`~fedepth.data.torchdata.FrameDataset`, whether the frames come
as sequences or as a robot's buffered frames), the seed derived from (recipe seed, round,
client id), :class:`~fedepth.training.LocalTrainer` with the recipe's optimizer and schedule,
and the strategy's client hook with the client's own memory. Same task, frames, client id and
round give the same update everywhere (on CPU, with the same torch thread count).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fedepth.data.torchdata import FrameDataset, FrameSource
from fedepth.models.base import DepthModel
from fedepth.recipe import TrainRecipe
from fedepth.strategies import ClientUpdate, State, TrainTask, make_client_hook
from fedepth.training import LocalTrainer


@dataclass
class RoundResult:
    """A client's round: the update to send, its hook memory afterwards, seconds in training."""

    update: ClientUpdate
    memory: dict[str, State]
    seconds: float


def round_dataset(frames: FrameSource, recipe: TrainRecipe, seed: int) -> FrameDataset:
    """The training items of a round: ``frames`` at the recipe's size, flipped by ``seed``."""
    return FrameDataset(frames, recipe.image_size, flip=recipe.flip, seed=seed)


def train_round(
    model: DepthModel,
    task: TrainTask,
    frames: FrameSource,
    *,
    cid: str,
    rnd: int,
    memory: Mapping[str, State] | None = None,
    fallback: TrainRecipe | None = None,
    device: str | None = None,
) -> RoundResult:
    """Train round ``rnd`` of client ``cid`` on ``frames`` as ``task`` prescribes.

    ``frames``: a sequence, a list of sequences or a list of frames. ``memory`` is the
    client's hook memory from earlier rounds (not modified; the result holds the new one).
    ``fallback`` is the recipe used when the task carries none (a coordinator that sends no
    recipe); the task's recipe always wins. ``device`` is the machine's (None: CUDA when
    available). The model is loaded with the task's state and left holding the trained one.
    """
    recipe = task.recipe if task.recipe is not None else fallback
    if recipe is None:
        raise ValueError(
            f"client {cid!r}, round {rnd}: the task carries no training recipe and no "
            "fallback recipe was given"
        )
    seed = recipe.round_seed(rnd, cid)
    dataset = round_dataset(frames, recipe, seed)
    trainer = LocalTrainer(model, config=recipe.train_config(seed, device=device))
    hook = make_client_hook(task, memory or {})
    own_focus = model.variance_focus
    if recipe.variance_focus is not None:
        model.variance_focus = recipe.variance_focus
    try:
        result = trainer.fit(dataset, state=task.state, hooks=() if hook is None else (hook,))
    finally:
        model.variance_focus = own_focus
    new_memory = dict(memory or {})
    if hook is not None:
        hook.remember(new_memory)
    update = ClientUpdate(
        cid=cid,
        state=result.state,
        num_samples=result.num_samples,
        num_steps=result.num_steps,
        extra=dict(result.extra),
        metrics={"loss": float(np.mean(result.losses))},
    )
    return RoundResult(update=update, memory=new_memory, seconds=result.seconds)
