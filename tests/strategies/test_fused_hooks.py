"""The fused client hooks (FedProx, FedDyn, SCAFFOLD) train bit for bit like the per-tensor loops
they replaced, kept here as the reference (benchmarks/client_hooks.py times both)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import numpy as np
import pytest
import torch
from torch import nn

from fedepth.models.base import DepthOutput
from fedepth.models.state import State
from fedepth.optconfig import OptimizerConfig, TrainConfig
from fedepth.strategies import fused
from fedepth.strategies.feddyn import FedDynHook
from fedepth.strategies.fedprox import FedProxHook
from fedepth.strategies.scaffold import CONTROL_DELTA, ScaffoldHook
from fedepth.training import (
    BaseHook,
    ExtraStates,
    LocalTrainer,
    TrainHook,
    TrainResult,
    param_tensors,
    snapshot,
    to_numpy,
    trainable_parameters,
)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(params=["one-block", "blocks"])
def block(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """FlatParams as one block (the default block size, more than TinyDepth's weights) or as
    several, split inside the model (so blocks start and end at other parameters)."""
    if request.param == "blocks":
        monkeypatch.setattr(fused, "BLOCK", 8)


# --- the reference: the hooks as they were before fusing (per-tensor loops, through autograd) ---


class RefFedProxHook(BaseHook):
    """FedProx's proximal term as a loss term summed tensor by tensor."""

    def __init__(self, *, mu: float) -> None:
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


class RefFedDynHook(BaseHook):
    """FedDyn's linear and quadratic terms as loss terms summed tensor by tensor."""

    def __init__(self, *, alpha: float, grad_state: State | None) -> None:
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


class RefScaffoldHook(BaseHook):
    """SCAFFOLD's correction and gradient sum, parameter by parameter at every step."""

    def __init__(self, *, server_control: State | None, client_control: State | None) -> None:
        self._server_np = server_control
        self._client_np = client_control
        self.client_control: dict[str, np.ndarray] | None = None
        self._c: dict[str, torch.Tensor] = {}
        self._ci: dict[str, torch.Tensor] = {}
        self._grad_sum: dict[str, torch.Tensor] = {}
        self._steps = 0

    def on_train_start(self, model: nn.Module, *, lr: float, num_steps: int) -> None:
        params = trainable_parameters(model)
        self._c = param_tensors(params, self._server_np, what="server control variate")
        self._ci = param_tensors(params, self._client_np, what="client control variate")
        self._grad_sum = {name: torch.zeros_like(c) for name, c in self._c.items()}
        self._steps = 0

    def after_backward(self, model: nn.Module) -> None:
        self._steps += 1
        for name, p in trainable_parameters(model).items():
            corr = (self._c[name] - self._ci[name]).to(p.dtype)
            if p.grad is None:
                p.grad = corr.clone()
            else:
                self._grad_sum[name].add_(p.grad.detach().float())
                p.grad.add_(corr)

    def on_train_end(self, model: nn.Module, num_steps: int) -> ExtraStates:
        new_ci: dict[str, torch.Tensor] = {}
        delta: dict[str, torch.Tensor] = {}
        for name, total in self._grad_sum.items():
            new_ci[name] = total / self._steps
            delta[name] = new_ci[name] - self._ci[name]
        self.client_control = to_numpy(new_ci)
        return {CONTROL_DELTA: to_numpy(delta)}


# --- a tiny depth model: convolutions (one channels-last), BatchNorm, an unused and a frozen
# parameter (the hooks cover the first, never the second) ---


class TinyDepth(nn.Module):
    min_depth = 0.1
    max_depth = 10.0

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.Conv2d(6, 1, 1)
        )
        self.body[0].to(memory_format=torch.channels_last)
        self.scale = nn.Parameter(torch.tensor(1.5))
        self.unused = nn.Parameter(torch.full((3,), 0.25))  # never reaches the loss: grad None
        self.frozen = nn.Parameter(torch.ones(2), requires_grad=False)

    def forward_train(self, rgb: torch.Tensor) -> DepthOutput:
        return DepthOutput(depth=nn.functional.softplus(self.body(rgb)) * self.scale)

    def loss(
        self, out: DepthOutput, gt: torch.Tensor, valid: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mse = ((out.depth - gt)[valid] ** 2).mean()
        return mse, {"mse": float(mse.detach())}


STEPS = 4
_gen = torch.Generator().manual_seed(0)
DATA = [
    (torch.rand(3, 8, 8, generator=_gen), 0.5 + torch.rand(1, 8, 8, generator=_gen))
    for _ in range(6)
]


def _model() -> TinyDepth:
    torch.manual_seed(0)
    return TinyDepth()


def _random_state(seed: int, scale: float) -> dict[str, np.ndarray]:
    """A state over TinyDepth's trainable parameters (a control or gradient state)."""
    rng = np.random.default_rng(seed)
    params = trainable_parameters(_model())
    return {
        n: (scale * rng.standard_normal(p.shape)).astype(np.float32) for n, p in params.items()
    }


def _train(hook: TrainHook) -> TrainResult:
    # the recipes' optimizer: AdamW with weight decay and clipping (lr large so weights move)
    opt = OptimizerConfig(name="adamw", lr=0.05, weight_decay=0.01, grad_clip=1.0)
    config = TrainConfig(num_steps=STEPS, batch_size=2, optimizer=opt, device="cpu", seed=3)
    trainer = LocalTrainer(_model(), config=config)  # type: ignore[arg-type]
    return trainer.fit(DATA, hooks=[hook])


def _assert_same_arrays(fused: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray]) -> None:
    assert list(fused) == list(ref)
    for name in ref:
        a, b = torch.from_numpy(np.asarray(fused[name])), torch.from_numpy(np.asarray(ref[name]))
        assert a.dtype == b.dtype and torch.equal(a, b), name


def _assert_same_training(
    fused: TrainResult, ref: TrainResult, *, loss_rel: float | None = None
) -> None:
    """Weights (and BatchNorm statistics) and extras bit for bit; reported losses exactly, or to
    ``loss_rel`` where the fused hook sums its regulariser's value in another order."""
    _assert_same_arrays(fused.state, ref.state)
    assert list(fused.extra) == list(ref.extra)
    for key in ref.extra:
        _assert_same_arrays(fused.extra[key], ref.extra[key])
    if loss_rel is None:
        assert fused.losses == ref.losses
        assert fused.terms == ref.terms
    else:
        assert fused.losses == pytest.approx(ref.losses, rel=loss_rel)
        assert fused.terms == pytest.approx(ref.terms, rel=loss_rel)


# The reported loss includes the regulariser's value, a sum of float32 reductions; fused, it is a
# sum of per-block dot products (and FedDyn's <g, w> is split as <g, w_g> + <g, w - w_g>), in
# another order than the reference's per-tensor ((w - w_g) ** 2).sum() and (g * w).sum(): it
# differs by float32 rounding (~1e-7 relative per sum). The value never feeds a gradient, so the
# weights stay bit-identical.
LOSS_REL = 1e-5


@pytest.mark.parametrize("mu", [0.0, 0.3])
@pytest.mark.usefixtures("block")
def test_fedprox_fused_is_the_loop(mu: float) -> None:
    ref, fused = _train(RefFedProxHook(mu=mu)), _train(FedProxHook(mu=mu))
    _assert_same_training(fused, ref, loss_rel=LOSS_REL if mu > 0 else None)
    assert fused.extra == {}
    if mu > 0:  # the term acted: the weights differ from FedAvg's
        plain = _train(BaseHook())
        assert not np.array_equal(fused.state["body.0.weight"], plain.state["body.0.weight"])
        assert fused.terms["regularizer"] > 0


@pytest.mark.parametrize("previous", [False, True])
@pytest.mark.usefixtures("block")
def test_feddyn_fused_is_the_loop(previous: bool) -> None:
    state = _random_state(1, 0.2) if previous else None
    ref_hook = RefFedDynHook(alpha=0.4, grad_state=state)
    hook = FedDynHook(alpha=0.4, grad_state=state)
    ref, fused = _train(ref_hook), _train(hook)
    _assert_same_training(fused, ref, loss_rel=LOSS_REL)
    assert ref_hook.grad_state is not None and hook.grad_state is not None
    _assert_same_arrays(hook.grad_state, ref_hook.grad_state)
    if previous:  # the linear term acted on the unused parameter too (its gradient is -g)
        assert not np.array_equal(fused.state["unused"], _model().unused.detach().numpy())


@pytest.mark.parametrize(
    ("server", "client"),
    [(None, None), ((2, 0.05), None), ((2, 0.05), (3, 0.02))],
    ids=["no-controls", "server-control", "both-controls"],
)
def test_scaffold_fused_is_the_loop(
    server: tuple[int, float] | None, client: tuple[int, float] | None
) -> None:
    def controls() -> dict[str, State | None]:
        return {
            "server_control": _random_state(*server) if server else None,
            "client_control": _random_state(*client) if client else None,
        }

    ref_hook, hook = RefScaffoldHook(**controls()), ScaffoldHook(**controls())
    ref, fused = _train(ref_hook), _train(hook)
    _assert_same_training(fused, ref)  # no regulariser: even the losses are the same
    assert ref_hook.client_control is not None and hook.client_control is not None
    _assert_same_arrays(hook.client_control, ref_hook.client_control)
    assert set(fused.extra[CONTROL_DELTA]) == set(trainable_parameters(_model()))


def test_fused_hooks_upload_and_remember_what_the_loops_did() -> None:
    """Same memory entries and uploads: FedProx and FedDyn upload nothing, SCAFFOLD its delta."""
    make: dict[str, Callable[[], TrainHook]] = {
        "fedprox": lambda: FedProxHook(mu=0.1),
        "feddyn": lambda: FedDynHook(alpha=0.1, grad_state=None),
        "scaffold": lambda: ScaffoldHook(server_control=None, client_control=None),
    }
    for name, factory in make.items():
        hook = factory()
        result = _train(hook)
        memory: dict[str, State] = {}
        hook.remember(memory)  # type: ignore[attr-defined]
        assert list(result.extra) == ([CONTROL_DELTA] if name == "scaffold" else []), name
        assert len(memory) == (0 if name == "fedprox" else 1), name


def test_flat_params_gathers_every_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Channels-last, non-dense (a strided slice), 0-d and plain tensors, in several blocks: the
    views hold the values with the tensors' own layout where dense, and follow in-place steps."""
    monkeypatch.setattr(fused, "BLOCK", 10)
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(4, 6, generator=gen)
    tensors = [
        torch.randn(2, 3, 2, 2, generator=gen).to(memory_format=torch.channels_last),
        base[:, ::2],  # not dense: gathered by a layout-converting copy
        torch.tensor(0.5),
        torch.randn(5, generator=gen),
    ]
    flat = fused.FlatParams(tensors).gather()
    assert flat.flat.numel() == sum(t.numel() for t in tensors)
    assert len(flat.blocks) > 1
    assert flat.views[0].stride() == tensors[0].stride()
    for view, t in zip(flat.views, tensors, strict=True):
        assert torch.equal(view, t)
    for t in tensors:
        t.mul_(2.0)
    flat.gather()
    for view, t in zip(flat.views, tensors, strict=True):
        assert torch.equal(view, t)
