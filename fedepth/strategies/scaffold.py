"""SCAFFOLD (Karimireddy et al., ICML 2020): control variates correct client drift.

Client half: :class:`ScaffoldHook` (option II, computed as the mean local gradient, which it
equals under plain SGD and which stays a gradient under AdamW). Server half: :class:`Scaffold`:
the global model moves by ``eta_g`` times the mean of the participants' model changes, and the
server control by ``|S| / N`` times the mean of their control changes,
``c <- c + |S|/N * mean(delta c_i)``.
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
    ``c_i``: this client's). After K local steps the client control becomes the mean of the K
    raw minibatch gradients, ``c_i+ = (1/K) sum_k g_k``; the hook returns
    ``delta c_i = c_i+ - c_i`` under :data:`CONTROL_DELTA` for upload and keeps ``c_i+`` in
    :attr:`client_control` for the client to store until its next round.

    With plain SGD this *is* the paper's option II: K steps of ``lr * (g_k + c - c_i)`` give
    ``(w_global - w_local) / (K * lr) = mean(g_k) + c - c_i``, so ``c_i - c + (w_global -
    w_local) / (K * lr) = mean(g_k)`` (tests/strategies/test_hooks.py checks both forms agree).
    Written as the mean gradient it stays a gradient under the optimizers the recipes use
    (AdamW, clipping): option II's weight difference over ``K * lr`` is then the mean of
    Adam's normalized steps, about 1 per coordinate whatever the gradient's size, and a control
    of that scale swamps the gradients it should correct (measured on HPE small: the training
    loss alternated between rounds, 6.0 / 7.3, and the test error rose; docs/results.md).

    Controls are numpy states over the trainable parameters (``None`` means zeros, the initial
    value). The per-step work is two ``torch._foreach_add_`` over the lists taken in
    :meth:`on_train_start` (``c - c_i`` computed once per round), bit for bit the per-tensor loop
    (tests/strategies/test_fused_hooks.py).
    """

    def __init__(self, *, server_control: State | None, client_control: State | None) -> None:
        self._server_np = server_control
        self._client_np = client_control
        self.client_control: dict[str, np.ndarray] | None = None
        self._names: list[str] = []
        self._params: list[nn.Parameter] = []
        self._ci: list[torch.Tensor] = []
        #: c - c_i in each parameter's dtype: the same every step, so computed once
        self._corr: list[torch.Tensor] = []
        self._grad_sum: list[torch.Tensor] = []
        self._steps = 0

    def on_train_start(self, model: nn.Module, *, lr: float, num_steps: int) -> None:
        params = trainable_parameters(model)
        c = param_tensors(params, self._server_np, what="server control variate")
        ci = param_tensors(params, self._client_np, what="client control variate")
        self._names = list(params)
        self._params = list(params.values())
        self._ci = list(ci.values())
        self._corr = [(c[name] - ci[name]).to(p.dtype) for name, p in params.items()]
        self._grad_sum = [torch.zeros_like(t) for t in self._ci]
        self._steps = 0

    def after_backward(self, model: nn.Module) -> None:
        """Adds each raw gradient to the running sum, then corrects it by ``c - c_i``
        (``torch._foreach_add_`` over all parameters; bit for bit the per-tensor loop)."""
        self._steps += 1
        grads = [p.grad for p in self._params]
        sums, corr = self._grad_sum, self._corr
        if any(g is None for g in grads):  # parameters the loss does not reach: g = c - c_i
            have = [i for i, g in enumerate(grads) if g is not None]
            for p, term in zip(self._params, corr, strict=True):
                if p.grad is None:
                    p.grad = term.clone()
            grads = [grads[i] for i in have]
            sums, corr = [sums[i] for i in have], [corr[i] for i in have]
        with torch.no_grad():
            torch._foreach_add_(sums, grads)  # type: ignore[arg-type]
            torch._foreach_add_(grads, corr)  # type: ignore[arg-type]

    def on_train_end(self, model: nn.Module, num_steps: int) -> ExtraStates:
        if self._steps <= 0:
            raise ValueError("SCAFFOLD needs at least one local step")
        new_ci = torch._foreach_div(self._grad_sum, self._steps)
        delta = torch._foreach_sub(new_ci, self._ci)
        self.client_control = to_numpy(dict(zip(self._names, new_ci, strict=True)))
        return {CONTROL_DELTA: to_numpy(dict(zip(self._names, delta, strict=True)))}

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
