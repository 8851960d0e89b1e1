"""Evaluation crops: exact boxes at the datasets' native sizes, scaled boxes on small frames,
and the crop each source is scored with."""

from __future__ import annotations

import numpy as np

from fedepth.data.crops import evaluation_crop, garg_crop_mask, nyu_eigen_crop_mask


def _box(mask: np.ndarray) -> tuple[int, int, int, int]:
    rows, cols = np.nonzero(mask)
    return int(rows.min()), int(rows.max()), int(cols.min()), int(cols.max())


def test_crops_at_native_size() -> None:
    garg = garg_crop_mask((375, 1242))
    assert garg.sum() == (int(0.99189189 * 375) - int(0.40810811 * 375)) * (
        int(0.96405229 * 1242) - int(0.03594771 * 1242)
    )
    assert garg[153, 44] and not garg[152, 44]
    # int(0.40810811 * 375) = 153, int(0.99189189 * 375) = 371,
    # int(0.03594771 * 1242) = 44, int(0.96405229 * 1242) = 1197
    assert _box(garg) == (153, 370, 44, 1196)
    nyu = nyu_eigen_crop_mask((480, 640))
    assert nyu.sum() == (471 - 45) * (601 - 41) and nyu[45, 41] and not nyu[44, 41]
    assert _box(nyu) == (45, 470, 41, 600)


def test_crops_scale_to_small_images() -> None:
    assert nyu_eigen_crop_mask((48, 64)).sum() == (47 - 4) * (60 - 4)


def test_each_source_is_scored_in_its_benchmark_crop() -> None:
    shape = (48, 64)
    np.testing.assert_array_equal(evaluation_crop("nyu", shape), nyu_eigen_crop_mask(shape))
    np.testing.assert_array_equal(evaluation_crop("kitti", shape), garg_crop_mask(shape))
    assert evaluation_crop("m3ed", shape) is None
