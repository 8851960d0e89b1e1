"""Centralized learning (CL), the upper bound: one model trained on the pooled data of all clients.

Not a federated algorithm: the simulation sees ``pooled = True`` and trains a single model on
the union of the clients' data, taking per round as many steps as all clients together (the
same compute and samples as the federation), then serves that model everywhere. As a
strategy it is FedAvg over that one pooled participant.

A centralised trainer is not bound by what keeps a federation stable (a small local lr, so that
a cluster of one robot is not damaged by its round's fresh optimizer), so CL may train with its
own learning rate, schedule across rounds and warmup (``lr``, ``round_schedule``,
``final_lr_fraction``, ``warmup_steps``; :func:`fedepth.sim.simulation.pooled_recipe`): the
upper bound is then what the pooled data allow, not the federation's recipe run on pooled data.
Unset, CL trains with the run's recipe.
"""

from __future__ import annotations

from typing import ClassVar

from fedepth.recipe import ROUND_SCHEDULES
from fedepth.strategies.fedavg import FedAvg


class Centralized(FedAvg):
    """Training on pooled data; the simulation drives it as a single participant.

    ``lr``: the pooled model's learning rate in round 0 (None: the run's); ``round_schedule``:
    how it changes across rounds (``constant`` or ``cosine`` to ``lr * final_lr_fraction``;
    None: the run's); ``warmup_steps``: linear warmup at the start of each round's steps, as
    each round starts a fresh optimizer (None: the run's).
    """

    name = "cl"
    pooled: ClassVar[bool] = True

    def __init__(
        self,
        lr: float | None = None,
        round_schedule: str | None = None,
        final_lr_fraction: float | None = None,
        warmup_steps: int | None = None,
    ) -> None:
        super().__init__()
        if lr is not None and not (
            isinstance(lr, int | float) and not isinstance(lr, bool) and lr > 0
        ):
            raise ValueError(f"cl: lr must be a number > 0, got {lr!r}")
        if round_schedule is not None and round_schedule not in ROUND_SCHEDULES:
            raise ValueError(
                f"cl: unknown round_schedule {round_schedule!r}; known: "
                f"{', '.join(ROUND_SCHEDULES)}"
            )
        if final_lr_fraction is not None and not 0 <= final_lr_fraction <= 1:
            raise ValueError(
                f"cl: final_lr_fraction must lie in [0, 1], got {final_lr_fraction!r}"
            )
        if warmup_steps is not None and not (isinstance(warmup_steps, int) and warmup_steps >= 0):
            raise ValueError(f"cl: warmup_steps must be an integer >= 0, got {warmup_steps!r}")
        #: None: the run's setting (SimConfig.lr, round_schedule, round_final_lr_fraction,
        #: warmup_steps)
        self.lr = None if lr is None else float(lr)
        self.round_schedule = round_schedule
        self.final_lr_fraction = final_lr_fraction
        self.warmup_steps = warmup_steps
