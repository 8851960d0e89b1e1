"""Client hooks of FedProx, SCAFFOLD and FedDyn against updates derived by hand (two SGD steps)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

from fedepth.models.base import DepthOutput
from fedepth.optconfig import OptimizerConfig, TrainConfig
from fedepth.strategies.feddyn import GRAD_STATE, FedDynHook
from fedepth.strategies.fedprox import FedProxHook
from fedepth.strategies.scaffold import CONTROL_DELTA, ScaffoldHook
from fedepth.training import BaseHook, LocalTrainer, TrainHook, TrainResult

LR, K = 0.1, 2
W0, B0 = np.array([0.2, 0.3]), 0.4


class Linear(nn.Module):
    """depth = w0 * red + w1 * green + b (+ a frozen offset); loss = MSE on valid pixels."""

    min_depth = 0.0
    max_depth = 100.0

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.tensor(W0, dtype=torch.float32))
        self.bias = nn.Parameter(torch.tensor(B0, dtype=torch.float32))
        self.offset = nn.Parameter(torch.tensor(0.0), requires_grad=False)

    def forward_train(self, rgb: torch.Tensor) -> DepthOutput:
        d = self.weight[0] * rgb[:, :1] + self.weight[1] * rgb[:, 1:2] + self.bias + self.offset
        return DepthOutput(depth=d)

    def loss(
        self, out: DepthOutput, gt: torch.Tensor, valid: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mse = ((out.depth - gt)[valid] ** 2).mean()
        return mse, {"mse": float(mse.detach())}


g = torch.Generator().manual_seed(0)
RGB = torch.rand(3, 1, 4, generator=g)
GT = 1.0 + torch.rand(1, 1, 4, generator=g)
X = RGB[:2, 0].numpy().astype(np.float64)  # (2, pixels)
Y = GT[0, 0].numpy().astype(np.float64)


def mse_grad(w: np.ndarray, b: float) -> tuple[np.ndarray, float]:
    """Gradient of mean((w @ x + b - y)^2), by hand."""
    r = w @ X + b - Y
    return 2 * (X * r).mean(axis=1), float(2 * r.mean())


def sgd(
    extra_grad: Callable[[np.ndarray, float], tuple[np.ndarray, float]],
) -> tuple[np.ndarray, float]:
    """K plain SGD steps on the MSE plus ``extra_grad(w, b)`` from (W0, B0)."""
    w, b = W0.copy(), B0
    for _ in range(K):
        gw, gb = mse_grad(w, b)
        ew, eb = extra_grad(w, b)
        w, b = w - LR * (gw + ew), b - LR * (gb + eb)
    return w, b


def train(hook: TrainHook) -> TrainResult:
    opt = OptimizerConfig(name="sgd", lr=LR, weight_decay=0.0, grad_clip=None)
    trainer = LocalTrainer(
        Linear(),  # type: ignore[arg-type]
        config=TrainConfig(num_steps=K, batch_size=1, optimizer=opt, device="cpu"),
    )
    return trainer.fit([(RGB, GT)], hooks=[hook])


def assert_state(result: TrainResult, w: np.ndarray, b: float) -> None:
    np.testing.assert_allclose(result.state["weight"], w, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(result.state["bias"], b, rtol=1e-5, atol=1e-7)
    assert result.state["offset"] == 0.0  # frozen: untouched by any hook


def test_fedprox_two_steps() -> None:
    mu = 0.5
    result = train(FedProxHook(mu=mu))
    w, b = sgd(lambda w, b: (mu * (w - W0), mu * (b - B0)))
    assert_state(result, w, b)
    # first step: the proximal term is zero at the global weights
    r0 = W0 @ X + B0 - Y
    assert result.losses[0] == pytest.approx(float((r0**2).mean()), rel=1e-5)
    assert result.extra == {}


def test_fedprox_mu_zero_is_plain_sgd() -> None:
    result = train(FedProxHook(mu=0.0))
    assert_state(result, *sgd(lambda w, b: (np.zeros(2), 0.0)))


def test_scaffold_option_two() -> None:
    c = {"weight": np.array([0.3, -0.2]), "bias": np.array(0.1)}
    ci = {"weight": np.array([0.05, 0.0]), "bias": np.array(-0.1)}
    hook = ScaffoldHook(server_control=c, client_control=ci)
    result = train(hook)
    corr_w, corr_b = c["weight"] - ci["weight"], float(c["bias"] - ci["bias"])
    w, b = sgd(lambda w, b: (corr_w, corr_b))
    assert_state(result, w, b)
    # c_i+ = c_i - c + (w_global - w_local) / (K lr)
    new_w = ci["weight"] - c["weight"] + (W0 - w) / (K * LR)
    new_b = ci["bias"] - c["bias"] + (B0 - b) / (K * LR)
    delta = result.extra[CONTROL_DELTA]
    assert set(delta) == {"weight", "bias"}
    np.testing.assert_allclose(delta["weight"], new_w - ci["weight"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(delta["bias"], new_b - ci["bias"], rtol=1e-4, atol=1e-6)
    assert hook.client_control is not None
    np.testing.assert_allclose(hook.client_control["weight"], new_w, rtol=1e-4, atol=1e-6)


def test_scaffold_zero_controls_is_sgd_and_delta_is_the_mean_gradient_step() -> None:
    hook = ScaffoldHook(server_control=None, client_control=None)
    result = train(hook)
    w, b = sgd(lambda w, b: (np.zeros(2), 0.0))
    assert_state(result, w, b)
    np.testing.assert_allclose(
        result.extra[CONTROL_DELTA]["weight"], (W0 - w) / (K * LR), rtol=1e-4, atol=1e-6
    )


class GradRecorder(BaseHook):
    """Records every step's raw gradients (listed before the hooks that change them)."""

    def __init__(self) -> None:
        self.grads: list[dict[str, np.ndarray]] = []

    def after_backward(self, model: nn.Module) -> None:
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        self.grads.append({n: g.detach().numpy().copy() for n, g in grads.items()})


def test_scaffold_control_is_the_mean_gradient_under_adamw() -> None:
    """With AdamW (the recipes' optimizer) c_i+ is the mean raw gradient, in gradient units;
    option II's (w_global - w_local) / (K lr) would be the mean of Adam's normalized steps."""
    c = {"weight": np.array([0.3, -0.2]), "bias": np.array(0.1)}
    ci = {"weight": np.array([0.05, 0.0]), "bias": np.array(-0.1)}
    recorder, hook = GradRecorder(), ScaffoldHook(server_control=c, client_control=ci)
    opt = OptimizerConfig(name="adamw", lr=LR, weight_decay=0.01, grad_clip=1.0)
    trainer = LocalTrainer(
        Linear(),  # type: ignore[arg-type]
        config=TrainConfig(num_steps=K, batch_size=1, optimizer=opt, device="cpu"),
    )
    result = trainer.fit([(RGB, GT)], hooks=[recorder, hook])
    assert len(recorder.grads) == K
    # the recorder sees the raw gradient: the first one is the MSE's gradient at the start
    np.testing.assert_allclose(recorder.grads[0]["weight"], mse_grad(W0, B0)[0], rtol=1e-5)
    mean = {n: np.mean([g[n] for g in recorder.grads], axis=0) for n in ("weight", "bias")}
    assert hook.client_control is not None
    for name in ("weight", "bias"):
        np.testing.assert_allclose(hook.client_control[name], mean[name], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(
            result.extra[CONTROL_DELTA][name], mean[name] - ci[name], rtol=1e-5, atol=1e-6
        )
    # option II's estimate is Adam's step size, not the gradient: first step |dw| = lr per weight
    option_two = ci["weight"] - c["weight"] + (W0 - result.state["weight"]) / (K * LR)
    assert not np.allclose(option_two, mean["weight"], rtol=0.1)


def test_scaffold_rejects_mismatched_controls() -> None:
    hook = ScaffoldHook(server_control={"weight": np.zeros(2)}, client_control=None)
    with pytest.raises(ValueError, match=r"server control variate.*bias"):
        train(hook)


def test_feddyn_two_steps() -> None:
    alpha = 0.2
    gs = {"weight": np.array([0.1, 0.4]), "bias": np.array(-0.3)}
    hook = FedDynHook(alpha=alpha, grad_state=gs)
    result = train(hook)
    # objective L(w) - <g, w> + alpha/2 ||w - w0||^2: gradient L'(w) - g + alpha (w - w0)
    w, b = sgd(
        lambda w, b: (-gs["weight"] + alpha * (w - W0), float(-gs["bias"] + alpha * (b - B0)))
    )
    assert_state(result, w, b)
    assert result.extra == {}  # the gradient state stays on the client
    new = hook.grad_state
    assert new is not None
    np.testing.assert_allclose(
        new["weight"], gs["weight"] - alpha * (w - W0), rtol=1e-5, atol=1e-7
    )
    np.testing.assert_allclose(new["bias"], gs["bias"] - alpha * (b - B0), rtol=1e-5, atol=1e-7)
    assert set(new) == {"weight", "bias"}
    memory: dict = {}
    hook.remember(memory)
    assert memory[GRAD_STATE] is new
    # the first step's objective includes the linear term at w0
    r0 = W0 @ X + B0 - Y
    lin = float(gs["weight"] @ W0 + gs["bias"] * B0)
    assert result.losses[0] == pytest.approx(float((r0**2).mean()) - lin, rel=1e-5)


def test_negative_coefficients_are_rejected() -> None:
    with pytest.raises(ValueError, match="mu"):
        FedProxHook(mu=-1.0)
    with pytest.raises(ValueError, match="alpha"):
        FedDynHook(alpha=-1.0, grad_state=None)
