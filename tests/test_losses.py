"""Loss tests against hand-computed values: SILog, the paper's SI loss, bin chamfer, sparsity."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from fedepth.losses import (
    bin_chamfer_loss,
    frequency_sparsity,
    si_loss,
    silog_from_log,
    silog_loss,
    valid_mask,
)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _pair() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # g = log(pred) - log(gt) = [0, 1] on the valid pixels; the third pixel is invalid
    pred = torch.tensor([1.0, math.e, 100.0]).view(1, 1, 1, 3)
    gt = torch.tensor([1.0, 1.0, 1.0]).view(1, 1, 1, 3)
    valid = torch.tensor([True, True, False]).view(1, 1, 1, 3)
    return pred, gt, valid


def test_silog_hand_value() -> None:
    pred, gt, valid = _pair()
    # mean(g^2) = 0.5, mean(g)^2 = 0.25: 10 * sqrt(0.5 - 0.85 * 0.25) = 10 * sqrt(0.2875)
    assert math.isclose(float(silog_loss(pred, gt, valid)), 10 * math.sqrt(0.2875), rel_tol=1e-6)


def test_si_loss_is_the_unrooted_form() -> None:
    pred, gt, valid = _pair()
    assert math.isclose(float(si_loss(pred, gt, valid)), 0.2875, rel_tol=1e-6)


def test_silog_from_log_agrees_with_metric_input() -> None:
    pred, gt, valid = _pair()
    a = silog_loss(pred, gt, valid, variance_focus=0.5)
    b = silog_from_log(torch.log(pred), gt, valid, variance_focus=0.5)
    torch.testing.assert_close(a, b)


def test_full_variance_focus_is_scale_invariant() -> None:
    g = torch.Generator().manual_seed(0)
    pred = 1 + torch.rand(2, 1, 4, 5, generator=g)
    gt = 1 + torch.rand(2, 1, 4, 5, generator=g)
    valid = torch.ones_like(gt, dtype=torch.bool)
    a = silog_loss(pred, gt, valid, variance_focus=1.0)
    b = silog_loss(3.0 * pred, gt, valid, variance_focus=1.0)
    torch.testing.assert_close(a, b)


def test_no_valid_pixel_gives_zero_with_gradient() -> None:
    pred = torch.rand(1, 1, 2, 2, requires_grad=True)
    loss = silog_loss(
        pred + 0.5, torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2, dtype=torch.bool)
    )
    loss.backward()
    assert float(loss.detach()) == 0.0
    assert pred.grad is not None and torch.equal(pred.grad, torch.zeros(1, 1, 2, 2))


def test_perfect_prediction_has_finite_gradient() -> None:
    gt = torch.full((1, 1, 2, 2), 2.0)
    pred = gt.clone().requires_grad_(True)
    silog_loss(pred, gt, torch.ones_like(gt, dtype=torch.bool)).backward()
    assert pred.grad is not None and torch.isfinite(pred.grad).all()


def test_shape_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="same shape"):
        silog_loss(torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 3), torch.ones(1, 1, 2, 3) > 0)


def test_valid_mask_excludes_zero_inf_nan_and_out_of_range() -> None:
    gt = torch.tensor([0.0, 0.5, 5.0, 10.0, 12.0, math.inf, math.nan])
    assert valid_mask(gt, 0.1, 10.0).tolist() == [False, True, True, False, False, False, False]


def test_bin_chamfer_hand_value() -> None:
    centers = torch.tensor([[1.0, 3.0]])
    gt = torch.tensor([1.0, 2.0, 4.0, 0.0]).view(1, 1, 1, 4)
    # centres -> nearest depth: 0, 1 (mean 1/2); depths -> nearest centre: 0, 1, 1 (mean 2/3)
    loss = bin_chamfer_loss(centers, gt, gt > 0)
    assert math.isclose(float(loss), 0.5 + 2 / 3, rel_tol=1e-6)


def test_bin_chamfer_matches_brute_force_value_and_gradient() -> None:
    g = torch.Generator().manual_seed(0)
    centers = torch.sort(10 * torch.rand(3, 16, generator=g), dim=1).values.requires_grad_(True)
    gt = 10 * torch.rand(3, 1, 6, 7, generator=g)
    valid = torch.rand(3, 1, 6, 7, generator=g) > 0.3
    valid[2] = False  # an image without valid depth is left out of the mean
    fast = bin_chamfer_loss(centers, gt, valid)
    (grad_fast,) = torch.autograd.grad(fast, centers)

    terms = []
    for b in range(2):
        y = gt[b][valid[b]]
        d = (centers[b][:, None] - y[None, :]) ** 2
        terms.append(d.min(dim=1).values.mean() + d.min(dim=0).values.mean())
    slow = torch.stack(terms).mean()
    (grad_slow,) = torch.autograd.grad(slow, centers)
    torch.testing.assert_close(fast, slow)
    torch.testing.assert_close(grad_fast, grad_slow)


def test_frequency_sparsity_hand_value() -> None:
    coeffs = torch.tensor([[1.0, -2.0, 0.0], [0.0, 0.0, 4.0]])
    weight = torch.tensor([0.0, 0.25, 0.75])
    # patch sums: 0.5 and 3.0, mean 1.75
    assert math.isclose(float(frequency_sparsity(coeffs, weight)), 1.75)
