"""The initial checkpoint: pretrained on a scenario's pretraining split, or loaded.

:func:`pretrain` is deterministic for a seed; :func:`initial_model` is a seeded model, loaded
strictly from a weights file when given.
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm import tqdm

from fedepth.data.scenario import Scenario
from fedepth.data.torchdata import FrameDataset
from fedepth.models import DepthModel
from fedepth.optconfig import OptimizerConfig, TrainConfig
from fedepth.sim.config import SimConfig
from fedepth.training import LocalTrainer


def pretrain(scenario: Scenario, config: SimConfig, *, progress: bool = True) -> DepthModel:
    """Train the initial checkpoint on the scenario's pretraining split (sequences no client
    sees): the stand-in for the ImageNet-pretrained encoders of the paper.

    Deterministic for a seed: it runs on ``config.pretrain_threads`` torch threads whatever the
    caller's setting (restored afterwards), so the checkpoint does not depend on the machine's
    core count.
    """
    if not scenario.pretrain:
        raise ValueError(f"scenario {scenario.root} has no pretraining split")
    before = torch.get_num_threads()
    torch.set_num_threads(config.pretrain_threads)
    try:
        return _pretrain(scenario, config, progress=progress)
    finally:
        torch.set_num_threads(before)


def _pretrain(scenario: Scenario, config: SimConfig, *, progress: bool) -> DepthModel:
    """One optimizer through the whole run: AdamW with ``pretrain_warmup`` of linear warmup,
    then a cosine decay to 2 % of ``pretrain_lr`` (a one-cycle shape)."""
    torch.manual_seed(config.seed)
    model = config.build_model()
    dataset = FrameDataset(scenario.pretrain, config.image_size, flip=True, seed=config.seed)
    steps = config.pretrain_steps
    trainer = LocalTrainer(
        model,
        config=TrainConfig(
            num_steps=steps,
            batch_size=config.pretrain_batch,
            optimizer=OptimizerConfig(
                lr=config.pretrain_lr,
                weight_decay=config.weight_decay,
                schedule="cosine",
                warmup_steps=min(round(config.pretrain_warmup * steps), steps - 1),
                final_lr_fraction=0.02,
            ),
            seed=config.seed,
        ),
    )
    bar = tqdm(total=steps, desc="pretrain", unit="step", disable=not progress)
    recent: list[float] = []

    def on_step(step: int, loss: float) -> None:
        recent.append(loss)
        bar.update(1)
        if (step + 1) % 25 == 0 or step + 1 == steps:
            bar.set_postfix(loss=f"{np.mean(recent[-25:]):.3f}")

    trainer.fit(dataset, on_step=on_step)
    bar.close()
    model.eval()
    return model


def initial_model(config: SimConfig, weights: str | None = None) -> DepthModel:
    """A seeded model, loaded strictly from ``weights`` when given."""
    torch.manual_seed(config.seed)
    model = config.build_model()
    if weights is not None:
        from fedepth.models import load_weights

        load_weights(model, weights)
    model.eval()
    return model
