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
from fedepth.training import BaseHook, snapshot, trainable_parameters


class FedProxHook(BaseHook):
    """Client half of FedProx: adds ``mu / 2 * ||w - w_global||^2`` to every local step's loss.

    ``w_global`` is the model's weights when training starts (the downloaded model); the sum
    runs over trainable parameters only (BatchNorm statistics and other buffers are not
    regularised). Uploads nothing extra.
    """

    def __init__(self, *, mu: float) -> None:
        if mu < 0:
            raise ValueError(f"FedProx mu must be >= 0, got {mu}")
        self.mu = float(mu)
        self._global: dict[str, torch.Tensor] = {}

    def on_train_start(self, model: nn.Module, *, lr: float, num_steps: int) -> None:
        self._global = snapshot(trainable_parameters(model))

    def regularizer(self, model: nn.Module) -> torch.Tensor | None:
        if self.mu == 0:
            return None
        params = trainable_parameters(model)
        sq = sum(((p.float() - self._global[n]) ** 2).sum() for n, p in params.items())
        return 0.5 * self.mu * torch.as_tensor(sq)

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
