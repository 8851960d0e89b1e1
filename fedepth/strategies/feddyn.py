"""FedDyn (Acar et al., ICLR 2021): dynamic regularisation aligns local and global optima."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedepth.models.state import State
from fedepth.training import (
    BaseHook,
    ExtraStates,
    param_tensors,
    snapshot,
    to_numpy,
    trainable_parameters,
)

#: Key of the client's updated gradient state in ``TrainResult.extra``.
GRAD_STATE = "feddyn.grad_state"


class FedDynHook(BaseHook):
    """Client half of FedDyn.

    The local objective is ``L(w) - <g_i, w> + alpha / 2 * ||w - w_global||^2``, with ``g_i``
    the client's gradient state (``None``: zeros, its initial value) and ``w_global`` the weights
    when training starts. After training ``g_i <- g_i - alpha * (w_local - w_global)``; the new
    state is returned under :data:`GRAD_STATE` and kept in :attr:`grad_state`. It stays on the
    client (the server rule needs only the model updates). Covers trainable parameters only.
    """

    def __init__(self, *, alpha: float, grad_state: State | None) -> None:
        if alpha < 0:
            raise ValueError(f"FedDyn alpha must be >= 0, got {alpha}")
        self.alpha = float(alpha)
        self._grad_np = grad_state
        self.grad_state: dict[str, np.ndarray] | None = None
        self._global: dict[str, torch.Tensor] = {}
        self._g: dict[str, torch.Tensor] = {}

    def on_train_start(self, model: nn.Module, *, lr: float, num_steps: int) -> None:
        params = trainable_parameters(model)
        self._global = snapshot(params)
        self._g = param_tensors(params, self._grad_np, what="FedDyn gradient state")

    def regularizer(self, model: nn.Module) -> torch.Tensor | None:
        total = torch.zeros((), device=next(iter(self._global.values())).device)
        for name, p in trainable_parameters(model).items():
            w = p.float()
            total = total - (self._g[name] * w).sum()
            total = total + 0.5 * self.alpha * ((w - self._global[name]) ** 2).sum()
        return total

    def on_train_end(self, model: nn.Module, num_steps: int) -> ExtraStates:
        new_g = {
            name: self._g[name] - self.alpha * (p.detach().float() - self._global[name])
            for name, p in trainable_parameters(model).items()
        }
        self.grad_state = to_numpy(new_g)
        return {GRAD_STATE: self.grad_state}
