"""What a run produces: round records, a method's run and its summary, the final numbers.

:class:`RoundRecord` per round, :class:`MethodRun` per method (its summary is a method's entry
of results.json), :func:`final_metrics`: the mean over the evaluations of the last rounds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedepth.strategies import Strategy

#: The metrics reported in tables (the paper's seven).
TABLE_METRICS = ("abs_rel", "sq_rel", "rmse", "rmse_log", "d1", "d2", "d3")


@dataclass
class RoundRecord:
    """What one round produced."""

    round: int
    train_seconds: float
    aggregate_seconds: float  # strategy.configure_train + aggregate_train
    wire_seconds: float  # encoding downloads, encoding + decoding + checking uploads
    mean_loss: float
    download_bytes: dict[str, int]
    upload_bytes: dict[str, int]
    test: dict[str, dict[str, float]] | None = None
    routes: dict[str, list[int]] | None = None
    #: test sequence -> cluster (as a string) -> the metrics of that cluster's model alone, for
    #: every sequence served by an average of several clusters (the averaged rounds only)
    candidates: dict[str, dict[str, dict[str, float]]] | None = None
    #: the validation split's metrics (``SimConfig.validation_share`` > 0, evaluated rounds):
    #: ``all`` (the mean over clients) and ``client:<name>``, each client's held-out frames
    #: scored with the model it downloads
    validation: dict[str, dict[str, float]] | None = None

    @property
    def overhead_seconds(self) -> float:
        return self.aggregate_seconds + self.wire_seconds


@dataclass
class MethodRun:
    """A method's run: per-round records, final metrics, per-group metrics, cluster map."""

    method: str
    rounds: list[RoundRecord]
    final: dict[str, float]
    per_sequence: dict[str, dict[str, float]]
    groups: dict[str, dict[str, float]]
    clusters: list[list[int]]
    descriptor_seconds: float  # the fleet's descriptors (shared by every method of a run)
    setup_seconds: float  # strategy.initialize: clustering, tau calibration
    samples: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]
    params: dict[str, Any]
    strategy: Strategy
    #: the validation split's final numbers (:func:`final_validation`; empty: none scored)
    validation: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        train = sum(r.train_seconds for r in self.rounds)
        per_round = sum(r.overhead_seconds for r in self.rounds)
        over = per_round + self.setup_seconds + self.descriptor_seconds
        return {
            **{k: self.final[k] for k in TABLE_METRICS if k in self.final},
            "final_all": self.final,
            "groups": self.groups,
            "per_sequence": self.per_sequence,
            "clusters": self.clusters,
            "params": self.params,
            "curves": {
                "round": [r.round for r in self.rounds],
                "train_loss": [r.mean_loss for r in self.rounds],
                "abs_rel": [
                    None if r.test is None else r.test["all"]["abs_rel"] for r in self.rounds
                ],
            },
            "timing": {
                "train_seconds": train,
                "overhead_seconds": over,
                "overhead_fraction": over / max(train + over, 1e-9),
                "round_overhead_fraction": per_round / max(train + per_round, 1e-9),
                "descriptor_seconds": self.descriptor_seconds,
                "setup_seconds": self.setup_seconds,
                "aggregate_seconds": sum(r.aggregate_seconds for r in self.rounds),
                "wire_seconds": sum(r.wire_seconds for r in self.rounds),
            },
            "bytes_per_round": {
                "download_mean": float(
                    np.mean([np.mean(list(r.download_bytes.values())) for r in self.rounds])
                ),
                "upload_mean": float(
                    np.mean([np.mean(list(r.upload_bytes.values())) for r in self.rounds])
                ),
                "per_round": [
                    {"download": r.download_bytes, "upload": r.upload_bytes} for r in self.rounds
                ],
            },
            "routes": self.rounds[-1].routes if self.rounds else None,
            **(
                {"route_candidates": candidates}
                if (candidates := route_candidates(self.rounds))
                else {}
            ),
            **({"validation": self.validation} if self.validation else {}),
        }


def route_candidates(records: Sequence[RoundRecord]) -> dict[str, dict[str, Any]]:
    """Every test sequence served by an average of several clusters, against each of those
    clusters' models alone: ``{seq: {"clusters": [...], "averaged": metrics, "alone": {k:
    metrics}}}``, each the mean over the evaluations that scored the candidates (the averaged
    rounds), so ``averaged`` is the sequence's number of the tables. Empty where no route
    averaged several clusters (global and hard-clustered methods) or nothing scored them."""
    rows: dict[str, list[tuple[dict[str, float], dict[str, dict[str, float]]]]] = {}
    clusters: dict[str, list[int]] = {}
    for r in records:
        if not r.candidates or r.test is None:
            continue
        for seq, alone in r.candidates.items():
            rows.setdefault(seq, []).append((r.test[f"seq:{seq}"], alone))
            clusters[seq] = (r.routes or {}).get(seq, [int(k) for k in alone])
    return {
        seq: {
            "clusters": clusters[seq],
            "averaged": _mean_dicts([averaged for averaged, _ in scored]),
            "alone": {k: _mean_dicts([alone[k] for _, alone in scored]) for k in scored[-1][1]},
        }
        for seq, scored in rows.items()
    }


def final_metrics(
    records: Sequence[RoundRecord], last_rounds: int
) -> tuple[dict[str, float], dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """A run's numbers: the mean over the evaluations of its last ``last_rounds`` rounds,
    overall, per platform/environment group and per test sequence."""
    tests = [r.test for r in records[-last_rounds:] if r.test is not None]
    last = tests[-1] if tests else {}
    final = _mean_dicts([t["all"] for t in tests])
    groups = {
        g: _mean_dicts([t[g] for t in tests])
        for g in last
        if g != "all" and not g.startswith("seq:")
    }
    per_seq = {g[4:]: _mean_dicts([t[g] for t in tests]) for g in last if g.startswith("seq:")}
    return final, groups, per_seq


def final_validation(records: Sequence[RoundRecord], last_rounds: int) -> dict[str, Any]:
    """A run's validation numbers, as :func:`final_metrics` gives its test numbers: the table
    metrics (``abs_rel``, ...) and ``final_all`` of the mean over clients, ``per_client``, each
    the mean over the validation scores of the last ``last_rounds`` rounds, and ``curve``: the
    mean Abs Rel over clients of every round (None where a round was not scored). Empty when
    no round was scored on a validation split."""
    if not any(r.validation for r in records):
        return {}
    scored = [r.validation for r in records[-last_rounds:] if r.validation]
    final = _mean_dicts([v["all"] for v in scored])
    clients = [g for g in scored[-1] if g.startswith("client:")] if scored else []
    return {
        **{k: final[k] for k in TABLE_METRICS if k in final},
        "final_all": final,
        "per_client": {
            g.removeprefix("client:"): _mean_dicts([v[g] for v in scored if g in v])
            for g in clients
        },
        "curve": [r.validation["all"]["abs_rel"] if r.validation else None for r in records],
    }


def strategy_outputs(
    strategy: Strategy, params: Mapping[str, Any], *, pooled: bool = False
) -> tuple[list[list[int]], dict[str, Any]]:
    """A trained strategy's cluster members (none for global or pooled methods) and its
    parameters with the thresholds it settled on (tau, PACFL's threshold), how they were set
    (``threshold_rule``) and, for FeDepth and hard clustering, the merge and routing rules
    (``merge``, ``routing``: :mod:`fedepth.cluster_rules`)."""
    clusters = (
        [np.flatnonzero(r).tolist() for r in strategy.M_star]
        if hasattr(strategy, "M_star") and not pooled
        else []
    )
    out = dict(params)
    for key in ("tau", "threshold"):
        if getattr(strategy, key, None) is not None:
            out[key] = float(getattr(strategy, key))
    rule = getattr(strategy, "threshold_rule", None)
    if rule is not None and not pooled:
        out["threshold_rule"] = str(rule)
    rules = getattr(strategy, "rules_meta", None)
    if callable(rules) and not pooled:  # FeDepth's and hard clustering's merge and routing
        out.update(rules())
    return clusters, out


def _mean_dicts(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    if not rows:
        return {}
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}
