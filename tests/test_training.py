"""LocalTrainer: fixed local compute, determinism, loss decrease, hooks, hand-checked SGD step."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import IterableDataset

from fedepth.models import create_model, get_state
from fedepth.models.base import DepthOutput
from fedepth.strategies.aggregate import weighted_mean
from fedepth.training import (
    BaseHook,
    ExtraStates,
    LocalTrainer,
    OptimizerConfig,
    TrainConfig,
    TrainHook,
    step_batches,
)

SGD = OptimizerConfig(name="sgd", lr=0.1, weight_decay=0.0, grad_clip=None)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class TinyDepth(nn.Module):
    """depth = w0 * red + w1 * green + b; loss = mean squared error on valid pixels."""

    min_depth = 0.0
    max_depth = 100.0

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.tensor([0.5, -0.25]))
        self.bias = nn.Parameter(torch.tensor(0.1))

    def forward_train(self, rgb: torch.Tensor) -> DepthOutput:
        d = self.weight[0] * rgb[:, :1] + self.weight[1] * rgb[:, 1:2] + self.bias
        return DepthOutput(depth=d)

    def loss(
        self, out: DepthOutput, gt: torch.Tensor, valid: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mse = ((out.depth - gt)[valid] ** 2).mean()
        return mse, {"mse": float(mse.detach())}


def _sample(seed: int, h: int = 1, w: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(3, h, w, generator=g), 1 + torch.rand(1, h, w, generator=g)


def test_step_batches_are_fixed_size_permutations() -> None:
    batches = step_batches(5, 2, 5, seed=3)
    assert len(batches) == 5 and all(len(b) == 2 for b in batches)
    flat = [i for b in batches for i in b]
    assert sorted(flat[:5]) == list(range(5)) and sorted(flat[5:10]) == list(range(5))
    assert batches == step_batches(5, 2, 5, seed=3)
    assert batches != step_batches(5, 2, 5, seed=4)
    small = step_batches(1, 4, 2, seed=0)  # a client smaller than a batch repeats samples
    assert small == [[0, 0, 0, 0], [0, 0, 0, 0]]


def test_one_sgd_step_by_hand() -> None:
    rgb, gt = _sample(0)
    trainer = LocalTrainer(
        TinyDepth(),
        config=TrainConfig(num_steps=1, batch_size=1, optimizer=SGD),  # type: ignore[arg-type]
    )
    w0, b0 = np.array([0.2, 0.3]), 0.4
    state = {"weight": w0.astype(np.float32), "bias": np.array(b0, dtype=np.float32)}
    result = trainer.fit([(rgb, gt)], state=state)
    x, y = rgb[:2, 0].numpy().astype(np.float64), gt[0, 0].numpy().astype(np.float64)
    r = w0 @ x + b0 - y  # residual per pixel
    grad_w, grad_b = 2 * (x * r).mean(axis=1), 2 * r.mean()
    np.testing.assert_allclose(result.state["weight"], w0 - 0.1 * grad_w, rtol=1e-5)
    np.testing.assert_allclose(result.state["bias"], b0 - 0.1 * grad_b, rtol=1e-5)
    assert result.losses == pytest.approx([float((r**2).mean())], rel=1e-5)


def test_fixed_compute_whatever_the_data_size() -> None:
    cfg = TrainConfig(num_steps=3, batch_size=2, optimizer=SGD)
    small = [_sample(i) for i in range(3)]
    large = [_sample(i) for i in range(30)]
    r_small = LocalTrainer(TinyDepth(), config=cfg).fit(small)  # type: ignore[arg-type]
    r_large = LocalTrainer(TinyDepth(), config=cfg).fit(large)  # type: ignore[arg-type]
    assert r_small.num_steps == r_large.num_steps == 3
    assert r_small.samples_seen == r_large.samples_seen == 6
    assert (r_small.num_samples, r_large.num_samples) == (3, 30)
    assert len(r_small.losses) == 3 and set(r_small.terms) == {"mse"}


def test_iterable_dataset_cycles() -> None:
    class Stream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
        def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            return iter([_sample(i) for i in range(3)])

    cfg = TrainConfig(num_steps=4, batch_size=2, optimizer=SGD)
    result = LocalTrainer(TinyDepth(), config=cfg).fit(Stream())  # type: ignore[arg-type]
    assert result.num_steps == 4 and result.num_samples == result.samples_seen == 8


def test_depth_without_channel_axis_is_accepted() -> None:
    rgb, gt = _sample(0)
    cfg = TrainConfig(num_steps=1, batch_size=1, optimizer=SGD)
    result = LocalTrainer(TinyDepth(), config=cfg).fit([(rgb, gt[0])])  # type: ignore[arg-type]
    assert np.isfinite(result.losses[0])


def test_uint8_images_are_rejected() -> None:
    rgb, gt = _sample(0)
    cfg = TrainConfig(num_steps=1, batch_size=1, optimizer=SGD)
    trainer = LocalTrainer(TinyDepth(), config=cfg)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="float in"):
        trainer.fit([((rgb * 255).to(torch.uint8), gt)])


def test_hooks_are_called_in_order() -> None:
    calls: list[str] = []

    class Recorder(BaseHook):
        def on_train_start(self, model: nn.Module, *, lr: float, num_steps: int) -> None:
            calls.append(f"start lr={lr} K={num_steps}")

        def regularizer(self, model: nn.Module) -> torch.Tensor | None:
            calls.append("reg")
            return torch.tensor(1.0)

        def after_backward(self, model: nn.Module) -> None:
            calls.append("grad")

        def on_train_end(self, model: nn.Module, num_steps: int) -> ExtraStates:
            calls.append(f"end K={num_steps}")
            return {"recorder": {"x": np.zeros(1)}}

    hook = Recorder()
    assert isinstance(hook, TrainHook)
    cfg = TrainConfig(num_steps=2, batch_size=1, optimizer=SGD)
    result = LocalTrainer(TinyDepth(), config=cfg).fit([_sample(0)], hooks=[hook])  # type: ignore[arg-type]
    assert calls == ["start lr=0.1 K=2", "reg", "grad", "reg", "grad", "end K=2"]
    assert set(result.extra) == {"recorder"}
    assert result.terms["regularizer"] == 1.0


def test_non_finite_loss_stops_the_round() -> None:
    class Poison(BaseHook):
        def regularizer(self, model: nn.Module) -> torch.Tensor | None:
            return torch.tensor(float("nan"))

    cfg = TrainConfig(num_steps=2, batch_size=1, optimizer=SGD)
    trainer = LocalTrainer(TinyDepth(), config=cfg)  # type: ignore[arg-type]
    with pytest.raises(FloatingPointError, match="step 0"):
        trainer.fit([_sample(0)], hooks=[Poison()])


def _images(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(100 + i)
        rgb = torch.rand(3, 48, 64, generator=g)
        depth = 1.0 + 3.0 * rgb[:1] + 0.1 * torch.rand(1, 48, 64, generator=g)
        depth[:, :4] = 0.0  # missing depth rows
        out.append((rgb, depth))
    return out


def test_a_few_steps_on_a_fixed_batch_reduce_the_loss() -> None:
    torch.manual_seed(0)
    model = create_model("regression-lite", min_depth=0.1, max_depth=10.0)
    cfg = TrainConfig(num_steps=12, batch_size=2, optimizer=OptimizerConfig(lr=1e-3), device="cpu")
    result = LocalTrainer(model, config=cfg).fit(_images(2))
    assert result.num_steps == 12
    assert np.mean(result.losses[-3:]) < 0.9 * result.losses[0]
    assert np.mean(result.losses[-3:]) < np.mean(result.losses[3:6])


def test_training_is_deterministic_on_cpu() -> None:
    torch.manual_seed(0)
    model = create_model("adabins-lite", min_depth=0.1, max_depth=10.0)
    start = get_state(model)
    cfg = TrainConfig(num_steps=3, batch_size=2, seed=7, device="cpu")
    trainer = LocalTrainer(model, config=cfg)
    data = _images(4)
    a = trainer.fit(data, state=start)
    b = trainer.fit(data, state=start)
    c = trainer.fit(data, state=start, seed=8)
    assert a.losses == b.losses
    assert all(np.array_equal(a.state[k], b.state[k]) for k in a.state)
    assert a.losses != c.losses
    assert any(k.endswith("running_mean") for k in a.state)
    merged = weighted_mean([a.state, c.state], [1.0, 3.0])
    assert merged.keys() == a.state.keys()


def test_model_mode_is_restored() -> None:
    model = TinyDepth().eval()
    LocalTrainer(model, config=TrainConfig(num_steps=1, batch_size=1, optimizer=SGD)).fit(  # type: ignore[arg-type]
        [_sample(0)]
    )
    assert not model.training


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_mixed_precision_round() -> None:
    model = create_model("regression-lite", min_depth=0.1, max_depth=10.0)
    cfg = TrainConfig(num_steps=3, batch_size=2, device="cuda")
    trainer = LocalTrainer(model, config=cfg)
    assert trainer.amp_dtype in (torch.bfloat16, torch.float16)
    result = trainer.fit(_images(2))
    assert all(np.isfinite(result.losses))
    assert all(v.dtype != np.float16 for v in result.state.values())


# -- learning-rate schedule within a round ------------------------------------------------------
def test_step_lrs_constant_cosine_and_warmup() -> None:
    assert OptimizerConfig(lr=0.1).step_lrs(4) == [0.1] * 4
    cos = OptimizerConfig(lr=1.0, schedule="cosine", final_lr_fraction=0.1).step_lrs(5)
    expected = [0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * j / 4)) for j in range(5)]
    assert cos == pytest.approx(expected, rel=1e-12)
    assert cos[0] == 1.0 and cos[-1] == pytest.approx(0.1, rel=1e-12)
    assert all(a > b for a, b in itertools.pairwise(cos))  # strictly decreasing
    warm = OptimizerConfig(lr=1.0, warmup_steps=3).step_lrs(5)
    assert warm == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0], rel=1e-12)
    both = OptimizerConfig(lr=2.0, schedule="cosine", warmup_steps=1, final_lr_fraction=0.0)
    assert both.step_lrs(4) == pytest.approx([1.0, 2.0, 1.0, 0.0], abs=1e-12)
    # one step after the warmup runs at lr; a one-step round at lr whatever the schedule
    assert OptimizerConfig(lr=1.0, schedule="cosine", warmup_steps=1).step_lrs(2) == [0.5, 1.0]
    assert OptimizerConfig(lr=1.0, schedule="cosine").step_lrs(1) == [1.0]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"schedule": "linear"}, "unknown schedule 'linear'"),
        ({"warmup_steps": 3}, r"warmup_steps must lie in \[0, num_steps\)"),
        ({"warmup_steps": -1}, "warmup_steps must lie"),
        ({"final_lr_fraction": 1.5}, r"final_lr_fraction must lie in \[0, 1\]"),
    ],
)
def test_bad_schedules_are_refused_when_the_trainer_is_built(
    changes: dict[str, object], message: str
) -> None:
    opt = OptimizerConfig(**changes)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        LocalTrainer(TinyDepth(), config=TrainConfig(num_steps=3, optimizer=opt))  # type: ignore[arg-type]


class _LrProbe(BaseHook):
    """Recovers each SGD step's learning rate from the weights: w' = w - lr * grad."""

    def __init__(self) -> None:
        self.before: torch.Tensor | None = None
        self.grads: list[torch.Tensor] = []
        self.lrs: list[float] = []
        self.start_lr = 0.0

    def on_train_start(self, model: nn.Module, *, lr: float, num_steps: int) -> None:
        self.start_lr = lr

    def after_backward(self, model: nn.Module) -> None:
        self.before = model.weight.detach().clone()  # type: ignore[operator]
        self.grads.append(model.weight.grad.detach().clone())  # type: ignore[union-attr]

    def after_step(self, model: nn.Module) -> None:
        assert self.before is not None
        delta = self.before - model.weight.detach()  # type: ignore[operator]
        self.lrs.append(float((delta / self.grads[-1]).mean()))


def test_the_schedule_reaches_the_optimizer_step_by_step() -> None:
    opt = replace(SGD, lr=0.1, schedule="cosine", warmup_steps=2, final_lr_fraction=0.2)
    model = TinyDepth()
    trainer = LocalTrainer(model, config=TrainConfig(num_steps=6, batch_size=1, optimizer=opt))  # type: ignore[arg-type]
    probe = _LrProbe()
    steps: list[tuple[int, float]] = []

    def on_step(step: int, loss: float) -> None:
        probe.after_step(model)
        steps.append((step, loss))

    result = trainer.fit([_sample(i) for i in range(3)], hooks=[probe], on_step=on_step)
    assert probe.lrs == pytest.approx(opt.step_lrs(6), rel=1e-4)
    assert [s for s, _ in steps] == list(range(6))
    assert [loss for _, loss in steps] == result.losses
    # the hooks see the mean learning rate: K * lr is the round's total step size (SCAFFOLD)
    assert probe.start_lr == pytest.approx(sum(opt.step_lrs(6)) / 6, rel=1e-12)


def _reference_round(
    model: TinyDepth, data: list[tuple[torch.Tensor, torch.Tensor]], steps: int, seed: int
) -> list[float]:
    """The trainer's default loop written out: AdamW(1e-4, wd 1e-2), clip 1.0, seeded batches."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-2)
    losses = []
    for batch in step_batches(len(data), 2, steps, seed):
        rgb = torch.stack([data[i][0] for i in batch])
        gt = torch.stack([data[i][1] for i in batch])
        opt.zero_grad(set_to_none=True)
        loss, _ = model.loss(model.forward_train(rgb), gt, (gt > 0.0) & (gt < 100.0))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def test_default_optimizer_is_bit_identical_to_the_plain_loop() -> None:
    data = [_sample(i, h=2, w=4) for i in range(5)]
    cfg = TrainConfig(num_steps=4, batch_size=2, seed=3, device="cpu")
    result = LocalTrainer(TinyDepth(), config=cfg).fit(data)  # type: ignore[arg-type]
    reference = TinyDepth()
    losses = _reference_round(reference, data, 4, seed=3)
    assert result.losses == losses
    assert np.array_equal(result.state["weight"], reference.weight.detach().numpy())
    assert np.array_equal(result.state["bias"], reference.bias.detach().numpy())
    # the per-step path with every step at lr (cosine to 1.0 x lr) changes nothing either
    flat = replace(cfg, optimizer=OptimizerConfig(schedule="cosine", final_lr_fraction=1.0))
    same = LocalTrainer(TinyDepth(), config=flat).fit(data)  # type: ignore[arg-type]
    assert same.losses == result.losses
    assert all(np.array_equal(same.state[k], result.state[k]) for k in result.state)
