"""FedDyn (Acar et al., ICLR 2021): dynamic regularisation aligns local and global optima.

Client half: :class:`FedDynHook`. Server half: :class:`FedDyn`, which keeps the server state
``h`` and sets ``theta^t = mean_k(theta_k) - h^t / alpha`` with
``h^t = h^{t-1} - alpha / m * sum_k (theta_k - theta^{t-1})`` over the participants k of the
round (m = all clients).
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

#: Key of the client's updated gradient state in ``TrainResult.extra``.
GRAD_STATE = "feddyn.grad_state"


class FedDynHook(BaseHook):
    """Client half of FedDyn.

    The local objective is ``L(w) - <g_i, w> + alpha / 2 * ||w - w_global||^2``, with ``g_i``
    the client's gradient state (``None``: zeros, its initial value) and ``w_global`` the weights
    when training starts. After training ``g_i <- g_i - alpha * (w_local - w_global)``; the new
    state is kept in :attr:`grad_state` (stored by :meth:`remember` in the client's memory) and
    never uploaded: the server rule needs only the model updates. Covers trainable parameters
    only.
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
        return {}

    @classmethod
    def from_task(cls, task: TrainTask, memory: Mapping[str, State]) -> FedDynHook:
        """The hook for one round: alpha from the server, g_i from the client's memory."""
        return cls(alpha=float(task.hook_params["alpha"]), grad_state=memory.get(GRAD_STATE))

    def remember(self, memory: dict[str, State]) -> None:
        """Store the updated gradient state for the client's next round."""
        if self.grad_state is not None:
            memory[GRAD_STATE] = self.grad_state


class FedDyn(FedAvg):
    """Server half of FedDyn: one global model with the dynamic correction ``h``.

    ``h`` covers the floating-point tensors other than BatchNorm statistics (the trainable
    parameters of the registered models); statistics and integer buffers are averaged.
    """

    name = "feddyn"
    client_hook = "feddyn"

    def __init__(self, *, alpha: float = 0.01) -> None:
        super().__init__()
        if alpha <= 0:
            raise ValueError(f"FedDyn alpha must be > 0, got {alpha}")
        self.alpha = float(alpha)
        self.h: dict[str, np.ndarray] = {}

    def hook_params(self) -> dict[str, float]:
        return {"alpha": self.alpha}

    def aggregate_train(self, rnd: int, updates: Sequence[ClientUpdate]) -> None:
        if not updates:
            return
        prev = self.cluster_states[0]
        mean = weighted_mean([u.state for u in updates], np.ones(len(updates)))
        m = len(self.clients)
        new: dict[str, np.ndarray] = {}
        for name, ref in prev.items():
            if not is_dynamic(name, ref):
                new[name] = mean[name]
                continue
            drift = sum(np.asarray(u.state[name], np.float64) - ref for u in updates)
            h = self.h.get(name, np.zeros(ref.shape)) - self.alpha / m * drift
            self.h[name] = h
            new[name] = (mean[name] - h / self.alpha).astype(ref.dtype)
        self.cluster_states[0] = new
        self._client_cache.clear()

    def state_dict(self) -> tuple[dict[str, Any], dict[str, State]]:
        meta, states = super().state_dict()
        states["feddyn/h"] = dict(self.h)
        return meta, states

    def load_state_dict(self, meta: Mapping[str, Any], states: Mapping[str, State]) -> None:
        super().load_state_dict(meta, states)
        self.h = dict(states.get("feddyn/h", {}))


def is_dynamic(name: str, tensor: np.ndarray) -> bool:
    """Whether a state tensor takes part in FedDyn's correction (floats, not BN statistics)."""
    return np.issubdtype(np.asarray(tensor).dtype, np.floating) and not name.endswith(
        ("running_mean", "running_var")
    )
