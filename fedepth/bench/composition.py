"""A clustered run's cluster composition, as results.json and report.md give it.

:func:`run_composition` describes a run's clusters (client indices, as a summary's
``clusters``) and its routes (test sequence -> cluster indices) by the labels of the seed's
fleet (:class:`~fedepth.bench.fleet_summary.FleetSummary`); :func:`with_composition` adds that
block to a run's summary under ``composition``. It is derived from what every summary already
holds, so runs recorded before it existed get it too when they are loaded. The arithmetic is
:mod:`fedepth.composition`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedepth import composition
from fedepth.bench.fleet_summary import FleetSummary


def _or_none(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else float(value)


def _labels(row: Mapping[str, str]) -> dict[str, str | None]:
    return {k: row.get(k) or None for k in composition.LABELS}


def run_composition(
    clusters: Sequence[Sequence[int]],
    fleet: FleetSummary,
    routes: Mapping[str, Sequence[int]] | None = None,
) -> dict[str, Any] | None:
    """The ``composition`` block of a clustered run (None for a run without clusters, or whose
    cluster indices do not fit the fleet).

    - ``clusters``: per cluster, ``members`` (``client`` index, ``name``, ``platform``,
      ``environment``; None where a label is unknown), ``counts`` (members per
      ``platform/environment``, most first) and ``label`` (``"spot/forest x3, car/forest x1"``);
    - ``co_members``: the mean over clients of the share of their co-members (the other members
      of any cluster they belong to) sharing their ``platform``, ``environment`` and ``both``
      (None where no client compares), and how many clients have none (``alone``);
    - ``routes``: per test sequence, the ``clusters`` it was routed to, its own ``platform`` and
      ``environment`` when the fleet recorded them, the ``counts`` and ``label`` of the routed
      clusters' members (each counted once) and ``shares``: the share of those members sharing
      the sequence's labels.
    """
    n = len(fleet.clients)
    if not clusters or any(not 0 <= int(c) < n for row in clusters for c in row):
        return None
    labels = fleet.clients
    M = np.zeros((len(clusters), n), dtype=bool)
    for k, row in enumerate(clusters):
        M[k, [int(c) for c in row]] = True
    shares = composition.co_member_shares(M, labels)
    out: dict[str, Any] = {
        "clusters": [_cluster(row, fleet) for row in clusters],
        "co_members": {
            **{k: _or_none(shares[k]) for k in (*composition.LABELS, "both")},
            "alone": int(shares["alone"]),
        },
        "routes": {},
    }
    own = dict(zip(fleet.test, fleet.test_labels, strict=False))
    for seq, ks in (routes or {}).items():
        if not ks or any(not 0 <= int(k) < len(clusters) for k in ks):
            continue
        members = np.flatnonzero(M[[int(k) for k in ks]].any(axis=0))
        counts = composition.composition_counts(members, labels)
        route: dict[str, Any] = {"clusters": [int(k) for k in ks]}
        if seq in own:
            route.update(_labels(own[seq]))
        route.update({"counts": counts, "label": composition.composition_label(counts)})
        if seq in own:
            route["shares"] = composition.member_shares(members, labels, own[seq])
        out["routes"][seq] = route
    return out


def _cluster(row: Sequence[int], fleet: FleetSummary) -> dict[str, Any]:
    counts = composition.composition_counts(row, fleet.clients)
    return {
        "members": [
            {"client": int(c), "name": fleet.clients[int(c)]["name"]}
            | _labels(fleet.clients[int(c)])
            for c in row
        ],
        "counts": counts,
        "label": composition.composition_label(counts),
    }


def with_composition(summary: Mapping[str, Any], fleet: FleetSummary) -> dict[str, Any]:
    """``summary`` with its ``composition`` block (:func:`run_composition`) when the run formed
    clusters; a run without clusters (global and pooled methods) is returned as it is."""
    block = run_composition(summary.get("clusters") or [], fleet, summary.get("routes"))
    return dict(summary) if block is None else {**summary, "composition": block}
