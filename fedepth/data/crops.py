"""Standard evaluation crops: KITTI KB (benchmark) crop, Garg and Eigen masks, NYUv2 Eigen crop.

The fractions and pixel boxes are those of the BTS / AdaBins / NeWCRFs evaluation code. For an
image smaller than the datasets' native size (the synthetic ``smoke`` and ``small`` profiles), the
pixel boxes are scaled with the image; at native size they are exact.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

BoolArray = npt.NDArray[np.bool_]

#: KITTI Garg crop, as fractions of (H, W): rows 0.40810811H..0.99189189H, cols 0.03594771W..
GARG_CROP = (0.40810811, 0.99189189, 0.03594771, 0.96405229)
#: KITTI Eigen crop, fractions of (H, W).
EIGEN_CROP_KITTI = (0.3324324, 0.91351351, 0.0359477, 0.96405229)
#: NYUv2 Eigen crop at 480 x 640: rows 45:471, cols 41:601.
NYU_EIGEN_CROP = (45, 471, 41, 601)
NYU_SIZE = (480, 640)
#: KITTI benchmark (KB) crop: 352 x 1216 at the bottom centre of a ~375 x 1242 image.
KB_CROP_SIZE = (352, 1216)
KITTI_NOMINAL_SIZE = (375, 1242)


def _fraction_mask(shape: tuple[int, int], box: tuple[float, float, float, float]) -> BoolArray:
    h, w = shape
    mask = np.zeros((h, w), dtype=bool)
    top, bottom, left, right = box
    mask[int(top * h) : int(bottom * h), int(left * w) : int(right * w)] = True
    return mask


def garg_crop_mask(shape: tuple[int, int]) -> BoolArray:
    """Garg et al.'s KITTI evaluation crop as a boolean (H, W) mask."""
    return _fraction_mask(shape, GARG_CROP)


def eigen_crop_mask_kitti(shape: tuple[int, int]) -> BoolArray:
    """Eigen et al.'s KITTI evaluation crop as a boolean (H, W) mask."""
    return _fraction_mask(shape, EIGEN_CROP_KITTI)


def nyu_eigen_crop_mask(shape: tuple[int, int]) -> BoolArray:
    """The NYUv2 Eigen crop (rows 45:471, cols 41:601 at 480 x 640), scaled to ``shape``."""
    h, w = shape
    t, b, left, r = NYU_EIGEN_CROP
    sy, sx = h / NYU_SIZE[0], w / NYU_SIZE[1]
    mask = np.zeros((h, w), dtype=bool)
    mask[round(t * sy) : round(b * sy), round(left * sx) : round(r * sx)] = True
    return mask


def kb_crop_box(shape: tuple[int, int]) -> tuple[int, int, int, int]:
    """(top, left, height, width) of the KITTI benchmark crop.

    At native size: ``top = H - 352``, ``left = (W - 1216) // 2`` as in BTS. A smaller image gets
    the box scaled by its size relative to KITTI's nominal 375 x 1242.
    """
    h, w = shape
    ch, cw = KB_CROP_SIZE
    if h < ch or w < cw:
        ch = max(1, round(ch * h / KITTI_NOMINAL_SIZE[0]))
        cw = max(1, round(cw * w / KITTI_NOMINAL_SIZE[1]))
        ch, cw = min(ch, h), min(cw, w)
    return h - ch, (w - cw) // 2, ch, cw


def kb_crop_mask(shape: tuple[int, int]) -> BoolArray:
    """The KB crop as a boolean (H, W) mask."""
    top, left, ch, cw = kb_crop_box(shape)
    mask = np.zeros(shape, dtype=bool)
    mask[top : top + ch, left : left + cw] = True
    return mask
