"""depth_node's unsupervised border, without ROS: the ``mask_border`` parameter checked, and
the depth within it blanked (NaN) before it is published."""

from __future__ import annotations

from typing import Any

import numpy as np


def border_fractions(values: Any) -> tuple[float, float, float, float]:
    """The ``mask_border`` parameter as (top, bottom, left, right) fractions; ValueError names
    what is wrong (not four numbers, one outside [0, 0.5))."""
    try:
        fractions = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise ValueError(f"four numbers (top, bottom, left, right), got {values!r}") from None
    if len(fractions) != 4:
        raise ValueError(f"four numbers (top, bottom, left, right), got {len(fractions)}")
    for side, f in zip(("top", "bottom", "left", "right"), fractions, strict=True):
        if not 0.0 <= f < 0.5:
            raise ValueError(f"{side} must be in [0, 0.5), got {f}")
    return fractions[0], fractions[1], fractions[2], fractions[3]


def mask_border(depth: np.ndarray, fractions: tuple[float, float, float, float]) -> np.ndarray:
    """A copy of (H, W) ``depth`` with NaN within the (top, bottom, left, right) fractions of its
    height and width, each rounded to whole pixels."""
    h, w = depth.shape
    top, bottom, left, right = (round(f * n) for f, n in zip(fractions, (h, h, w, w), strict=True))
    out = np.array(depth, dtype=np.float32, copy=True)
    out[:top] = np.nan
    out[h - bottom :] = np.nan
    out[:, :left] = np.nan
    out[:, w - right :] = np.nan
    return out
