"""A run's results over several seeds: means, sample standard deviations, differences.

:func:`combine_seeds` makes a run's entry of results.json from its per-seed summaries;
:func:`beyond_spread` says whether two runs differ by more than their combined spread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedepth.sim import TABLE_METRICS


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values))


def _std(values: Sequence[float]) -> float:
    """Sample standard deviation (ddof = 1) over seeds; 0 for a single seed."""
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def _combine_metrics(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Mean of every metric under its name, then its spread under ``<name>_std``."""
    if not rows:
        return {}
    names = list(rows[0])
    out = {k: _mean([r[k] for r in rows]) for k in names}
    out.update({f"{k}_std": _std([r[k] for r in rows]) for k in names})
    return out


def _combine_curves(curves: Sequence[Mapping[str, list[Any]]]) -> dict[str, list[Any]]:
    def mean_or_none(values: list[Any]) -> float | None:
        return None if any(v is None for v in values) else _mean(values)

    first = curves[0]
    return {
        **first,
        "train_loss": [
            _mean(list(v)) for v in zip(*(c["train_loss"] for c in curves), strict=True)
        ],
        "abs_rel": [
            mean_or_none(list(v)) for v in zip(*(c["abs_rel"] for c in curves), strict=True)
        ],
    }


def _combine_validation(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The validation entries of several seeds: their table metrics, ``final_all`` and every
    client's metrics as mean and ``<metric>_std``, the curve as the mean over the seeds."""
    final = _combine_metrics([r["final_all"] for r in rows])
    clients = dict.fromkeys(c for r in rows for c in r["per_client"])
    curves = [r["curve"] for r in rows]
    return {
        **{k: final[k] for k in TABLE_METRICS if k in final},
        **{f"{k}_std": final[f"{k}_std"] for k in TABLE_METRICS if k in final},
        "final_all": final,
        "per_client": {
            c: _combine_metrics([r["per_client"][c] for r in rows if c in r["per_client"]])
            for c in clients
        },
        "curve": [
            None if any(v is None for v in vs) else _mean(list(vs))
            for vs in zip(*curves, strict=True)
        ],
    }


def combine_seeds(per_seed: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """One run's entry in results.json from its per-seed summaries (keyed by seed, in order).

    The layout of a single summary: the table metrics are means over the seeds, followed by
    their sample standard deviations ``<metric>_std`` (0 for one seed); ``final_all`` and every
    entry of ``groups`` and ``per_sequence`` likewise (a group or sequence: over the seeds that
    have it); ``curves``, ``timing`` and the byte means are means over the seeds; what has no
    mean (clusters, params, routes, per-round bytes, transport details) is the first seed's;
    the ``validation`` numbers (a run with a validation split) as the table metrics.
    ``seeds`` holds every seed's full summary.
    """
    runs = list(per_seed.values())
    first = runs[0]
    out: dict[str, Any] = {}
    for key, value in first.items():
        if key in TABLE_METRICS:
            out[key] = _mean([r[key] for r in runs])
        elif key == "final_all":
            out[key] = _combine_metrics([r[key] for r in runs])
        elif key in ("groups", "per_sequence"):
            names = dict.fromkeys(g for r in runs for g in r[key])
            out[key] = {
                g: _combine_metrics([r[key][g] for r in runs if g in r[key]]) for g in names
            }
        elif key == "curves":
            out[key] = _combine_curves([r[key] for r in runs])
        elif key == "timing":
            out[key] = {k: _mean([r[key][k] for r in runs]) for k in value}
        elif key == "validation":
            out[key] = _combine_validation([r[key] for r in runs if key in r])
        elif key == "bytes_per_round":
            out[key] = {
                **value,
                **{k: _mean([r[key][k] for r in runs]) for k in ("download_mean", "upload_mean")},
            }
        else:
            out[key] = value
    stds = {f"{k}_std": _std([r[k] for r in runs]) for k in TABLE_METRICS if k in first}
    last = next((k for k in reversed(list(out)) if k in TABLE_METRICS), None)
    ordered: dict[str, Any] = {}
    for key, value in out.items():
        ordered[key] = value
        if key == last:
            ordered.update(stds)
    ordered["seeds"] = {s: dict(r) for s, r in per_seed.items()}
    return ordered


def beyond_spread(a: Mapping[str, Any], b: Mapping[str, Any], metric: str) -> bool:
    """Whether two runs differ in ``metric`` by more than their combined spread over seeds:
    ``|mean_a - mean_b| > std_a + std_b``."""
    spread = a.get(f"{metric}_std", 0.0) + b.get(f"{metric}_std", 0.0)
    return bool(abs(a[metric] - b[metric]) > spread)
