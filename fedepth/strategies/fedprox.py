"""FedProx (Li et al., MLSys 2020): a proximal term keeps local weights near the global ones.

Client half: :class:`FedProxHook`. Server half: :class:`FedProx`, which aggregates like FedAvg
and sends ``mu`` with every round's task.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from fedepth.models.state import State
from fedepth.strategies.base import TrainTask
from fedepth.strategies.fedavg import FedAvg
from fedepth.strategies.fused import FlatParams, add_to_grads
from fedepth.training import BaseHook, trainable_parameters


class FedProxHook(BaseHook):
    """Client half of FedProx: adds ``mu / 2 * ||w - w_global||^2`` to every local step's loss.

    ``w_global`` is the model's weights when training starts (the downloaded model); the sum
    runs over trainable parameters only (BatchNorm statistics and other buffers are not
    regularised). Uploads nothing extra.

    Fused (:mod:`fedepth.strategies.fused`): at every step :meth:`regularizer` gathers the
    parameters into one flat buffer, block by block, and computes there both the term's value
    (returned detached, for the loss the trainer reports) and its gradient
    ``mu * (w - w_global)``, which :meth:`after_backward` adds to the parameters' gradients
    instead of autograd. The gradients, and so the trained weights, are bit for bit those of
    the term in the loss whenever each parameter is used once in the forward pass (autograd
    then adds the term's gradient to the model's in a single sum;
    tests/strategies/test_fused_hooks.py); the reported value is a sum of dot products instead
    of per-tensor sums, equal up to float rounding. A hook listed before this one sees the
    gradient without the term.
    """

    def __init__(self, *, mu: float) -> None:
        if mu < 0:
            raise ValueError(f"FedProx mu must be >= 0, got {mu}")
        self.mu = float(mu)
        self._params: list[nn.Parameter] = []
        self._global = FlatParams([])
        self._diff = FlatParams([])
        self._pending = False

    def on_train_start(self, model: nn.Module, *, lr: float, num_steps: int) -> None:
        self._params = list(trainable_parameters(model).values())
        self._global = FlatParams(self._params).gather()
        self._diff = FlatParams(self._params)
        self._pending = False

    def regularizer(self, model: nn.Module) -> torch.Tensor | None:
        if self.mu == 0:
            return None
        sq = []
        with torch.no_grad():
            for d, w_global in zip(self._diff.blocks, self._global.blocks, strict=True):
                part = d.gather()
                part.sub_(w_global.part)  # w - w_global
                sq.append(torch.dot(part, part))
                # the gradient term now, while the block is in cache: mu * (w - w_global),
                # rounded as autograd rounds it
                part.mul_(self.mu)
            self._pending = True
            return 0.5 * self.mu * (torch.stack(sq).sum() if sq else torch.zeros(()))

    def after_backward(self, model: nn.Module) -> None:
        if self._pending:
            self._pending = False
            add_to_grads(self._params, self._diff.views)

    @classmethod
    def from_task(cls, task: TrainTask, memory: Mapping[str, State]) -> FedProxHook:
        return cls(mu=float(task.hook_params["mu"]))

    def remember(self, memory: dict[str, State]) -> None:
        return None


class FedProx(FedAvg):
    """FedAvg on the server; clients add the proximal term with coefficient ``mu``."""

    name = "fedprox"
    client_hook = "fedprox"

    def __init__(self, *, mu: float = 0.01) -> None:
        super().__init__()
        if mu < 0:
            raise ValueError(f"FedProx mu must be >= 0, got {mu}")
        self.mu = float(mu)

    def hook_params(self) -> dict[str, float]:
        return {"mu": self.mu}
