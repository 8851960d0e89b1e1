"""Metric depth ranges: the one source of every depth-range default in the project.

Two ranges exist, those of the benchmarks the paper evaluates on: indoor as NYUv2 (up to
10 m), outdoor as KITTI (up to 80 m), both from 1 mm. They serve as a sequence's evaluation
caps (metrics count a pixel only where ``min_depth < gt < max_depth``) and as a model's output
range. A fleet model must cover both, so :data:`FLEET` (the outdoor range) is the range of a
model built without one: the simulation's, the coordinator's fresh model, ``create_model``'s.

Every depth range the project takes in (a :class:`DepthRange`, a sequence's caps, a model, a
model card, the coordinator's configuration, a bag's metadata) is checked by the one rule of
:func:`check_depth_range`: ``0 < min_depth < max_depth``, both finite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def check_depth_range(min_depth: float, max_depth: float, what: str = "a depth range") -> None:
    """Raise ValueError (naming ``what``) unless ``0 < min_depth < max_depth``, both finite."""
    if not (math.isfinite(min_depth) and math.isfinite(max_depth) and 0 < min_depth < max_depth):
        raise ValueError(
            f"{what}: need 0 < min_depth < max_depth (finite), got {min_depth} and {max_depth}"
        )


@dataclass(frozen=True)
class DepthRange:
    """``min_depth`` to ``max_depth`` in metres (:func:`check_depth_range`)."""

    min_depth: float
    max_depth: float

    def __post_init__(self) -> None:
        check_depth_range(self.min_depth, self.max_depth)


#: NYUv2's evaluation caps: indoor scenes
INDOOR = DepthRange(1e-3, 10.0)
#: KITTI's evaluation caps: outdoor scenes
OUTDOOR = DepthRange(1e-3, 80.0)
#: the range of a model that serves a whole fleet, indoors and out
FLEET = OUTDOOR


def for_environment(environment: str) -> DepthRange:
    """The evaluation caps of a sequence recorded in ``environment``: :data:`INDOOR` for
    ``indoor``, :data:`OUTDOOR` for every other environment (urban, forest, ...)."""
    return INDOOR if environment == "indoor" else OUTDOOR
