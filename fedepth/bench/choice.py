"""Choosing a sweep point on the validation split, never on the test sequences.

:func:`choose_by_validation` picks, among candidates (sweep points: FeDepth at an overlap target
or under a merge / routing rule), the one of lowest final validation Abs Rel (the held-out tails
of the training clients' own sequences, ``SimConfig.validation_share``);
:func:`validation_choice` makes results.json's ``chosen`` entry of a benchmark's sweeps, with
the chosen point's test numbers beside it: reported, never used to choose.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedepth.bench.spec import sweep_name

#: the validation metric a sweep point is chosen by (lower is better)
CHOICE_METRIC = "abs_rel"

#: results.json's sweeps, in the order their points are candidates
SWEEPS = ("overlap_sweep", "rule_sweep")


def choose_by_validation(candidates: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The name of the candidate (a run's results.json entry) of lowest final validation Abs
    Rel (its ``validation.abs_rel``; the first of equals, in the given order); candidates
    without validation numbers take no part. None when no candidate has them."""
    best: tuple[float, str] | None = None
    for name, entry in candidates.items():
        value = (entry.get("validation") or {}).get(CHOICE_METRIC)
        if not isinstance(value, (int, float)):
            continue
        if best is None or value < best[0]:
            best = (float(value), name)
    return None if best is None else best[1]


def point_name(sweep: str, point: str) -> str:
    """How the report names a sweep point: ``fedepth@20%`` or ``fedepth merge=cliques``."""
    return sweep_name(float(point)) if sweep == "overlap_sweep" else f"fedepth {point}"


def validation_choice(results: Mapping[str, Any]) -> dict[str, Any] | None:
    """results.json's ``chosen``: the sweep point (of the overlap and the rule sweep together)
    of lowest final validation Abs Rel, with its validation and test Abs Rel; None when no
    point has validation numbers (no validation split, or no sweep)."""
    candidates: dict[str, Mapping[str, Any]] = {}
    where: dict[str, tuple[str, str]] = {}
    for sweep in SWEEPS:
        for point, entry in (results.get(sweep) or {}).items():
            name = point_name(sweep, point)
            candidates[name] = entry
            where[name] = (sweep, point)
    chosen = choose_by_validation(candidates)
    if chosen is None:
        return None
    entry = candidates[chosen]
    return {
        "by": "validation",
        "metric": CHOICE_METRIC,
        "name": chosen,
        "sweep": where[chosen][0],
        "point": where[chosen][1],
        "validation_abs_rel": entry["validation"][CHOICE_METRIC],
        "test_abs_rel": entry.get(CHOICE_METRIC),
        "candidates": {
            name: {
                "validation_abs_rel": (e.get("validation") or {}).get(CHOICE_METRIC),
                "test_abs_rel": e.get(CHOICE_METRIC),
            }
            for name, e in candidates.items()
        },
    }
