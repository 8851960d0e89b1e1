"""The evaluation crops of the source benchmarks: NYUv2's Eigen crop and KITTI's Garg crop.

Boxes as in the BTS / AdaBins / NeWCRFs evaluation code. An image smaller than the dataset's
native size (the synthetic profiles, or any frame resized to the training resolution) gets the
box scaled with the image; at native size it is exact. :func:`evaluation_crop` picks a
sequence's crop from its source; the simulation scores test frames inside it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

BoolArray = npt.NDArray[np.bool_]

#: KITTI Garg crop, as fractions of (H, W): rows 0.40810811H..0.99189189H, cols 0.03594771W..
GARG_CROP = (0.40810811, 0.99189189, 0.03594771, 0.96405229)
#: NYUv2 Eigen crop at 480 x 640: rows 45:471, cols 41:601.
NYU_EIGEN_CROP = (45, 471, 41, 601)
NYU_SIZE = (480, 640)


def garg_crop_mask(shape: tuple[int, int]) -> BoolArray:
    """Garg et al.'s KITTI evaluation crop as a boolean (H, W) mask."""
    h, w = shape
    top, bottom, left, right = GARG_CROP
    mask = np.zeros((h, w), dtype=bool)
    mask[int(top * h) : int(bottom * h), int(left * w) : int(right * w)] = True
    return mask


def nyu_eigen_crop_mask(shape: tuple[int, int]) -> BoolArray:
    """The NYUv2 Eigen crop (rows 45:471, cols 41:601 at 480 x 640), scaled to ``shape``."""
    h, w = shape
    t, b, left, r = NYU_EIGEN_CROP
    sy, sx = h / NYU_SIZE[0], w / NYU_SIZE[1]
    mask = np.zeros((h, w), dtype=bool)
    mask[round(t * sy) : round(b * sy), round(left * sx) : round(r * sx)] = True
    return mask


def evaluation_crop(source: str, shape: tuple[int, int]) -> BoolArray | None:
    """The (H, W) evaluation crop of a sequence from ``source``: the Eigen crop for ``nyu``,
    the Garg crop for ``kitti``, None (the whole image) for others such as ``m3ed``."""
    if source == "nyu":
        return nyu_eigen_crop_mask(shape)
    if source == "kitti":
        return garg_crop_mask(shape)
    return None
