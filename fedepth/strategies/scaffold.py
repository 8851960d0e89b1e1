"""SCAFFOLD (Karimireddy et al., ICML 2020): control variates correct client drift.

Client half: :class:`ScaffoldHook` (option II). Server half: :class:`Scaffold`: the global model
moves by ``eta_g`` times the mean of the participants' model changes, and the server control
by ``|S| / N`` times the mean of their control changes, ``c <- c + |S|/N * mean(delta c_i)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from fedepth.models.state import State
from fedepth.strategies.aggregate import weighted_mean
from fedepth.strategies.base import ClientUpdate, TrainTask
from fedepth.strategies.fedavg import FedAvg
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
#: Key of the server control variate in ``TrainTask.hook_state`` (what the client downloads).
SERVER_CONTROL = "scaffold.server_control"
#: Key of the client control variate in the client's own memory (never uploaded).
CLIENT_CONTROL = "scaffold.client_control"


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

    @classmethod
    def from_task(cls, task: TrainTask, memory: Mapping[str, State]) -> ScaffoldHook:
        """The hook for one round: c from the server (None: zeros), c_i from the client."""
        return cls(
            server_control=task.hook_state.get(SERVER_CONTROL) or None,
            client_control=memory.get(CLIENT_CONTROL),
        )

    def remember(self, memory: dict[str, State]) -> None:
        """Store c_i+ for the client's next round."""
        if self.client_control is not None:
            memory[CLIENT_CONTROL] = self.client_control


class Scaffold(FedAvg):
    """Server half of SCAFFOLD with global step size ``eta_g`` (1: the mean of the models)."""

    name = "scaffold"
    client_hook = "scaffold"

    def __init__(self, *, eta_g: float = 1.0) -> None:
        super().__init__()
        if eta_g <= 0:
            raise ValueError(f"SCAFFOLD eta_g must be > 0, got {eta_g}")
        self.eta_g = float(eta_g)
        self.control: dict[str, np.ndarray] = {}

    def hook_state(self, cid: str) -> dict[str, State]:
        return {SERVER_CONTROL: self.control} if self.control else {}

    def aggregate_train(self, rnd: int, updates: Sequence[ClientUpdate]) -> None:
        if not updates:
            return
        x = self.cluster_states[0]
        mean = weighted_mean([u.state for u in updates], np.ones(len(updates)))
        new: dict[str, np.ndarray] = {}
        for name, ref in x.items():
            if np.issubdtype(ref.dtype, np.floating):
                step = mean[name].astype(np.float64) - ref
                new[name] = (ref + self.eta_g * step).astype(ref.dtype)
            else:
                new[name] = mean[name]
        self.cluster_states[0] = new
        deltas = [u.extra[CONTROL_DELTA] for u in updates if CONTROL_DELTA in u.extra]
        if deltas:
            frac = len(deltas) / len(self.clients)
            mean_delta = weighted_mean(deltas, np.ones(len(deltas)))
            for name, d in mean_delta.items():
                base = self.control.get(name, np.zeros(d.shape, dtype=d.dtype))
                self.control[name] = (base + frac * d).astype(d.dtype)
        self._client_cache.clear()

    def state_dict(self) -> tuple[dict[str, Any], dict[str, State]]:
        meta, states = super().state_dict()
        states["scaffold/control"] = dict(self.control)
        return meta, states

    def load_state_dict(self, meta: Mapping[str, Any], states: Mapping[str, State]) -> None:
        super().load_state_dict(meta, states)
        self.control = dict(states.get("scaffold/control", {}))
