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
from fedepth.strategies.fused import FlatParams, add_to_grads
from fedepth.training import (
    BaseHook,
    ExtraStates,
    param_tensors,
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

    Fused (:mod:`fedepth.strategies.fused`): at every step :meth:`regularizer` gathers the
    parameters into one flat buffer, block by block, and computes there both the regulariser's
    value (returned detached, for the loss the trainer reports), as
    ``alpha / 2 * ||d||^2 - <g_i, d> - <g_i, w_global>`` with ``d = w - w_global`` (the last
    term once per round), and its gradient ``alpha * d - g_i``, which :meth:`after_backward`
    adds to the parameters' gradients instead of autograd. The gradients, and so the trained
    weights and the new state, are bit for bit those of the regulariser in the loss whenever
    each parameter is used once in the forward pass (tests/strategies/test_fused_hooks.py); the
    reported value equals the per-tensor sums up to float rounding. A hook listed before this
    one sees the gradient without the term.
    """

    def __init__(self, *, alpha: float, grad_state: State | None) -> None:
        if alpha < 0:
            raise ValueError(f"FedDyn alpha must be >= 0, got {alpha}")
        self.alpha = float(alpha)
        self._grad_np = grad_state
        self.grad_state: dict[str, np.ndarray] | None = None
        self._names: list[str] = []
        self._params: list[nn.Parameter] = []
        self._global = FlatParams([])
        self._g = FlatParams([])
        self._g_dot_global = torch.zeros(())
        self._diff = FlatParams([])
        self._pending = False

    def on_train_start(self, model: nn.Module, *, lr: float, num_steps: int) -> None:
        params = trainable_parameters(model)
        g = param_tensors(params, self._grad_np, what="FedDyn gradient state")
        self._names = list(params)
        self._params = list(params.values())
        self._global = FlatParams(self._params).gather()
        self._g = FlatParams(self._params).copy_(list(g.values()))
        self._g_dot_global = torch.dot(self._g.flat, self._global.flat)
        self._diff = FlatParams(self._params)
        self._pending = False

    def regularizer(self, model: nn.Module) -> torch.Tensor | None:
        parts = []
        with torch.no_grad():
            blocks = zip(self._diff.blocks, self._global.blocks, self._g.blocks, strict=True)
            for d, w_global, g in blocks:
                part = d.gather()
                part.sub_(w_global.part)  # w - w_global
                parts.append(0.5 * self.alpha * torch.dot(part, part) - torch.dot(g.part, part))
                # the gradient term now, while the block is in cache: alpha * (w - w_global)
                # rounded as autograd rounds it, then - g_i (autograd sums these two before
                # adding the model's gradient)
                part.mul_(self.alpha).sub_(g.part)
            self._pending = True
            total = torch.stack(parts).sum() if parts else torch.zeros(())
            return total - self._g_dot_global

    def after_backward(self, model: nn.Module) -> None:
        if self._pending:
            self._pending = False
            add_to_grads(self._params, self._diff.views)

    def on_train_end(self, model: nn.Module, num_steps: int) -> ExtraStates:
        step = self._diff.gather().flat
        with torch.no_grad():
            step.sub_(self._global.flat).mul_(self.alpha)
            torch.sub(self._g.flat, step, out=step)  # g_i - alpha * (w - w_global)
        self.grad_state = to_numpy(dict(zip(self._names, self._diff.views, strict=True)))
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
