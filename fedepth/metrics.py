"""Standard monocular depth metrics, exactly as AdaBins / BTS ``compute_errors``, per image.

For one image: valid pixels are ``min_depth < gt < max_depth`` (and finite, and inside an optional
crop mask); the prediction is first clamped to ``[min_depth, max_depth]`` (+inf -> max, NaN ->
min). Dataset figures are the mean over images of the per-image values (:func:`mean_errors`,
:func:`evaluate_images`), not a pixel-pooled mean.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

import numpy as np
import numpy.typing as npt

METRICS = ("abs_rel", "sq_rel", "rmse", "rmse_log", "log10", "silog", "d1", "d2", "d3")

CropKind = Literal["eigen_nyu", "eigen_kitti", "garg"]

#: NYUv2 Eigen crop on the 480 x 640 frame (rows 45:471, columns 41:601).
NYU_EIGEN_CROP = (45, 471, 41, 601)


def compute_errors(
    gt: npt.ArrayLike,
    pred: npt.ArrayLike,
    min_depth: float,
    max_depth: float,
    *,
    mask: npt.ArrayLike | None = None,
) -> dict[str, float]:
    """abs_rel, sq_rel, rmse, rmse_log, log10, silog, d1, d2, d3 of one image.

    ``gt`` and ``pred`` are metric depth maps of one shape (a leading or trailing singleton axis
    is fine); ``mask`` optionally restricts evaluation (e.g. :func:`crop_mask`). silog is
    ``100 * sqrt(mean(e^2) - mean(e)^2)``, ``e = log(pred) - log(gt)``. Raises ``ValueError``
    when no pixel is valid.
    """
    g = np.asarray(gt, dtype=np.float64)
    p = np.asarray(pred, dtype=np.float64)
    if g.shape != p.shape:
        raise ValueError(f"ground truth {g.shape} and prediction {p.shape} differ in shape")
    p = np.where(np.isnan(p), min_depth, p)
    p = np.clip(p, min_depth, max_depth)  # +inf -> max_depth
    valid = np.isfinite(g) & (g > min_depth) & (g < max_depth)
    if mask is not None:
        m = np.asarray(mask, dtype=bool)
        if m.shape != g.shape:
            raise ValueError(f"mask {m.shape} and ground truth {g.shape} differ in shape")
        valid &= m
    if not valid.any():
        raise ValueError("no valid ground-truth pixel in this image")
    g, p = g[valid], p[valid]
    thresh = np.maximum(g / p, p / g)
    err = np.log(p) - np.log(g)
    return {
        "abs_rel": float(np.mean(np.abs(g - p) / g)),
        "sq_rel": float(np.mean((g - p) ** 2 / g)),
        "rmse": float(np.sqrt(np.mean((g - p) ** 2))),
        "rmse_log": float(np.sqrt(np.mean(err**2))),
        "log10": float(np.mean(np.abs(np.log10(g) - np.log10(p)))),
        "silog": float(100.0 * np.sqrt(max(np.mean(err**2) - np.mean(err) ** 2, 0.0))),
        "d1": float(np.mean(thresh < 1.25)),
        "d2": float(np.mean(thresh < 1.25**2)),
        "d3": float(np.mean(thresh < 1.25**3)),
    }


def mean_errors(per_image: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Mean of per-image metric dicts (each metric averaged over the images)."""
    rows = list(per_image)
    if not rows:
        raise ValueError("no per-image metrics to average")
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}


def evaluate_images(
    gts: Iterable[npt.ArrayLike],
    preds: Iterable[npt.ArrayLike],
    *,
    min_depth: float,
    max_depth: float,
    crop: CropKind | None = None,
) -> dict[str, float]:
    """Per-image :func:`compute_errors` over pairs, then the mean; adds ``num_images``.

    Each map is (H, W), (1, H, W) or (H, W, 1). Images with no valid pixel are skipped (as
    upstream's ``has_valid_depth``); ``crop`` applies the named evaluation crop to each image.
    """
    rows = []
    for g, p in zip(gts, preds, strict=True):
        g2, p2 = _as_2d(g), _as_2d(p)
        m = crop_mask(g2.shape, crop) if crop else None
        try:
            rows.append(compute_errors(g2, p2, min_depth, max_depth, mask=m))
        except ValueError as exc:
            if "no valid" not in str(exc):
                raise
    out = mean_errors(rows)
    out["num_images"] = float(len(rows))
    return out


def _as_2d(depth: npt.ArrayLike) -> np.ndarray:
    """(H, W), (1, H, W) or (H, W, 1) -> (H, W)."""
    a = np.asarray(depth)
    if a.ndim == 3 and a.shape[0] == 1:
        a = a[0]
    elif a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    if a.ndim != 2:
        raise ValueError(f"expected an (H, W) depth map (or (1, H, W), (H, W, 1)), got {a.shape}")
    return a


def crop_mask(shape: tuple[int, ...], kind: CropKind) -> np.ndarray:
    """Boolean (H, W) evaluation crop.

    ``garg`` (KITTI, Garg et al.): rows 0.40810811 H .. 0.99189189 H, columns
    0.03594771 W .. 0.96405229 W. ``eigen_kitti``: rows 0.3324324 H .. 0.91351351 H, the same
    columns. ``eigen_nyu``: rows 45:471, columns 41:601 on a 480 x 640 frame, scaled by the same
    fractions on other sizes.
    """
    if len(shape) != 2:
        raise ValueError(f"crop_mask needs an (H, W) shape, got {shape}")
    h, w = int(shape[0]), int(shape[1])
    m = np.zeros((h, w), dtype=bool)
    if kind == "garg":
        m[int(0.40810811 * h) : int(0.99189189 * h), int(0.03594771 * w) : int(0.96405229 * w)] = (
            True
        )
    elif kind == "eigen_kitti":
        m[int(0.3324324 * h) : int(0.91351351 * h), int(0.0359477 * w) : int(0.96405229 * w)] = (
            True
        )
    elif kind == "eigen_nyu":
        r0, r1, c0, c1 = NYU_EIGEN_CROP
        if (h, w) != (480, 640):
            r0, r1 = int(r0 / 480 * h), int(r1 / 480 * h)
            c0, c1 = int(c0 / 640 * w), int(c1 / 640 * w)
        m[r0:r1, c0:c1] = True
    else:
        raise ValueError(f"unknown crop {kind!r}; known: eigen_nyu, eigen_kitti, garg")
    return m
