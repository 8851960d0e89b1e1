"""SCAFFOLD (Karimireddy et al., ICML 2020): control variates correct client drift."""

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

#: Key of the client's control-variate change in ``TrainResult.extra`` (what it uploads).
CONTROL_DELTA = "scaffold.control_delta"


class ScaffoldHook(BaseHook):
    """Client half of SCAFFOLD, option II.

    Every local step's gradient is corrected to ``g + c - c_i`` (``c``: server control variate,
    ``c_i``: this client's). After K local steps with learning rate ``lr`` the client control
    becomes ``c_i+ = c_i - c + (w_global - w_local) / (K * lr)``; the hook returns
    ``delta c_i = c_i+ - c_i`` under :data:`CONTROL_DELTA` for upload and keeps ``c_i+`` in
    :attr:`client_control` for the client to store until its next round.

    Controls are numpy states over the trainable parameters (``None`` means zeros, the initial
    value). ``lr`` is the trainer's learning rate, given at ``on_train_start``. Option II
    assumes plain SGD steps; with adaptive optimizers the same formula is applied as is.
    """

    def __init__(self, *, server_control: State | None, client_control: State | None) -> None:
        self._server_np = server_control
        self._client_np = client_control
        self.client_control: dict[str, np.ndarray] | None = None
        self._lr = 0.0
        self._global: dict[str, torch.Tensor] = {}
        self._c: dict[str, torch.Tensor] = {}
        self._ci: dict[str, torch.Tensor] = {}

    def on_train_start(self, model: nn.Module, *, lr: float, num_steps: int) -> None:
        params = trainable_parameters(model)
        self._lr = float(lr)
        self._global = snapshot(params)
        self._c = param_tensors(params, self._server_np, what="server control variate")
        self._ci = param_tensors(params, self._client_np, what="client control variate")

    def after_backward(self, model: nn.Module) -> None:
        for name, p in trainable_parameters(model).items():
            corr = (self._c[name] - self._ci[name]).to(p.dtype)
            if p.grad is None:
                p.grad = corr.clone()
            else:
                p.grad.add_(corr)

    def on_train_end(self, model: nn.Module, num_steps: int) -> ExtraStates:
        if num_steps <= 0 or self._lr <= 0:
            raise ValueError("SCAFFOLD needs at least one local step and a positive lr")
        scale = 1.0 / (num_steps * self._lr)
        new_ci: dict[str, torch.Tensor] = {}
        delta: dict[str, torch.Tensor] = {}
        for name, p in trainable_parameters(model).items():
            new_ci[name] = (
                self._ci[name] - self._c[name] + (self._global[name] - p.detach().float()) * scale
            )
            delta[name] = new_ci[name] - self._ci[name]
        self.client_control = to_numpy(new_ci)
        return {CONTROL_DELTA: to_numpy(delta)}
