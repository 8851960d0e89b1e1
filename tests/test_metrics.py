"""Metric tests against values computed by hand on small arrays."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedepth.data.crops import nyu_eigen_crop_mask
from fedepth.metrics import METRICS, compute_errors, mean_errors


def test_hand_computed_metrics() -> None:
    gt = np.array([1.0, 2.0, 4.0])
    pred = np.array([1.0, 1.0, 5.0])
    e = compute_errors(gt, pred, 0.1, 10.0)
    assert set(e) == set(METRICS)
    # |gt - pred| = [0, 1, 1]
    assert math.isclose(e["abs_rel"], (0 + 1 / 2 + 1 / 4) / 3)
    assert math.isclose(e["sq_rel"], (0 + 1 / 2 + 1 / 4) / 3)
    assert math.isclose(e["rmse"], math.sqrt(2 / 3))
    err = [0.0, math.log(1 / 2), math.log(5 / 4)]  # log(pred) - log(gt)
    mean_sq = sum(x * x for x in err) / 3
    mean = sum(err) / 3
    assert math.isclose(e["rmse_log"], math.sqrt(mean_sq))
    assert math.isclose(e["log10"], (0 + math.log10(2) + math.log10(5 / 4)) / 3)
    assert math.isclose(e["silog"], 100 * math.sqrt(mean_sq - mean**2))
    # max(gt/pred, pred/gt) = [1, 2, 1.25]; 1.25 is not < 1.25
    assert math.isclose(e["d1"], 1 / 3)
    assert math.isclose(e["d2"], 2 / 3)
    assert math.isclose(e["d3"], 2 / 3)


def test_hand_values_rounded() -> None:
    e = compute_errors(np.array([1.0, 2.0, 4.0]), np.array([1.0, 1.0, 5.0]), 0.1, 10.0)
    assert round(e["rmse"], 6) == 0.816497
    assert round(e["rmse_log"], 6) == 0.420415
    assert round(e["silog"], 4) == 39.0133


def test_invalid_ground_truth_is_ignored() -> None:
    gt = np.array([[0.0, 2.0], [12.0, np.inf]])  # only 2.0 is inside (0.1, 10)
    pred = np.array([[7.0, 2.0], [3.0, 3.0]])
    e = compute_errors(gt, pred, 0.1, 10.0)
    assert e["abs_rel"] == 0.0 and e["d1"] == 1.0


def test_prediction_is_clamped_first() -> None:
    gt = np.array([10.0 - 1e-9, 0.2, 0.2])
    pred = np.array([np.inf, np.nan, -3.0])  # -> 10, 0.1, 0.1
    e = compute_errors(gt, pred, 0.1, 10.0)
    assert math.isclose(e["abs_rel"], (1e-9 / (10 - 1e-9) + 0.5 + 0.5) / 3, rel_tol=1e-9)


def test_mask_restricts_evaluation() -> None:
    gt = np.array([1.0, 1.0])
    pred = np.array([1.0, 2.0])
    e = compute_errors(gt, pred, 0.1, 10.0, mask=np.array([True, False]))
    assert e["rmse"] == 0.0


def test_no_valid_pixel_raises() -> None:
    with pytest.raises(ValueError, match="no valid"):
        compute_errors(np.zeros(4), np.ones(4), 0.1, 10.0)


def test_averaging_is_per_image_then_mean() -> None:
    gt_a, pred_a = np.ones((1, 2)), np.full((1, 2), 2.0)  # abs_rel 1, on 2 pixels
    gt_b, pred_b = np.ones((3, 3)), np.ones((3, 3))  # abs_rel 0, on 9 pixels
    rows = [compute_errors(gt_a, pred_a, 0.1, 10.0), compute_errors(gt_b, pred_b, 0.1, 10.0)]
    assert mean_errors(rows)["abs_rel"] == 0.5  # not the pixel-pooled 2/11


def test_mask_restricts_the_pixels() -> None:
    gt = np.ones((480, 640))
    pred = np.ones((480, 640))
    pred[0, 0] = 5.0  # outside the NYUv2 Eigen crop
    assert (
        compute_errors(gt, pred, 0.1, 10.0, mask=nyu_eigen_crop_mask(gt.shape))["abs_rel"] == 0.0
    )
    assert compute_errors(gt, pred, 0.1, 10.0)["abs_rel"] > 0.0
