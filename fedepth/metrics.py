"""Standard monocular depth metrics, exactly as AdaBins / BTS ``compute_errors``, per image.

For one image: valid pixels are ``min_depth < gt < max_depth`` (and finite, and inside an optional
crop mask, :func:`fedepth.data.crops.evaluation_crop`); the prediction is first clamped to
``[min_depth, max_depth]`` (+inf -> max, NaN -> min). Dataset figures are the mean over images
of the per-image values (:func:`mean_errors`), not a pixel-pooled mean.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import numpy.typing as npt

METRICS = ("abs_rel", "sq_rel", "rmse", "rmse_log", "log10", "silog", "d1", "d2", "d3")


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
    is fine); ``mask`` optionally restricts evaluation (e.g. to the crop of
    :func:`fedepth.data.crops.evaluation_crop`). silog is ``100 * sqrt(mean(e^2) - mean(e)^2)``,
    ``e = log(pred) - log(gt)``. Raises ``ValueError`` when no pixel is valid.
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
