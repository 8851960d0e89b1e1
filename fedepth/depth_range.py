"""Metric depth ranges: the one source of every depth-range default in the project.

Two ranges exist, those of the benchmarks the paper evaluates on: indoor as NYUv2 (up to
10 m), outdoor as KITTI (up to 80 m), both from 1 mm. They serve as a sequence's evaluation
caps (metrics count a pixel only where ``min_depth < gt < max_depth``) and as a model's output
range. A fleet model must cover both, so :data:`FLEET` (the outdoor range) is the range of a
model built without one: the simulation's, the coordinator's fresh model, ``create_model``'s.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DepthRange:
    """``min_depth`` to ``max_depth`` in metres (``0 <= min_depth < max_depth``)."""

    min_depth: float
    max_depth: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_depth < self.max_depth:
            raise ValueError(
                f"a depth range needs 0 <= min_depth < max_depth, got {self.min_depth} and "
                f"{self.max_depth}"
            )


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
