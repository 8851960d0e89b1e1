"""The RGB-D frame types of the bag and sensor paths: a duck type and a plain record.

:class:`fedepth.data.Frame` checks its arrays; the bag writer and the robot's frame buffer
(:mod:`fedepth_ros.sync`) take any :class:`FrameLike`, and :class:`RGBDFrame` is the record
they make themselves (synthetic test scenes, frames read back from disk), without checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


class FrameLike(Protocol):
    """What the bag writer and the frame buffer take: the duck type of ``fedepth.data.Frame``."""

    @property
    def rgb(self) -> np.ndarray: ...  # (H, W, 3) uint8

    @property
    def depth(self) -> np.ndarray: ...  # (H, W) float32 metres, 0 = invalid

    @property
    def K(self) -> np.ndarray: ...  # noqa: N802  (3, 3) intrinsics

    @property
    def stamp_ns(self) -> int: ...


@dataclass(frozen=True, slots=True)
class RGBDFrame:
    """One paired RGB-D frame: rgb (H, W, 3) uint8, depth (H, W) float32 m (0 = invalid)."""

    rgb: np.ndarray
    depth: np.ndarray
    K: np.ndarray
    stamp_ns: int
