"""Aggregation arithmetic shared by every strategy: plain functions on dicts of numpy arrays.

A *state* (:data:`fedepth.models.state.State`) is a mapping from tensor name to array (a
model's ``state_dict`` as numpy). All means
accumulate in float64 and are cast back to each tensor's dtype; integer tensors (BatchNorm's
``num_batches_tracked``) are rounded to the nearest integer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from fedepth.models.state import State

#: How one cluster's model is made from its members' states and sample counts.
ClusterRule = Callable[[Sequence[State], Sequence[float]], State]


def weighted_mean(
    states: Sequence[State], weights: Sequence[float] | npt.ArrayLike
) -> dict[str, np.ndarray]:
    """``sum_i w_i * state_i / sum_i w_i`` tensor by tensor.

    All states must have the same names, shapes and dtypes; weights must be non-negative with a
    positive sum.
    """
    if len(states) == 0:
        raise ValueError("weighted_mean needs at least one state")
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.size != len(states):
        raise ValueError(f"{w.size} weights given for {len(states)} states")
    if not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights must be finite, non-negative and sum to > 0, got {w.tolist()}")
    w = w / w.sum()
    out: dict[str, np.ndarray] = {}
    for name in _check_names(states, "weighted_mean"):
        ref = np.asarray(states[0][name])
        acc = np.zeros(ref.shape, dtype=np.float64)
        for wi, s in zip(w, states, strict=True):
            t = np.asarray(s[name])
            if t.shape != ref.shape:
                raise ValueError(f"tensor {name!r}: shape {t.shape} differs from {ref.shape}")
            if wi:
                acc += wi * t
        out[name] = _cast(acc, ref.dtype)
    return out


#: Per-cluster aggregation rules (``robust_mean``'s ``method``).
AGGREGATIONS = ("mean", "trimmed_mean", "median")


def _stacked(states: Sequence[State], name: str) -> tuple[np.ndarray, np.dtype[Any]]:
    ref = np.asarray(states[0][name])
    arrays = []
    for s in states:
        t = np.asarray(s[name])
        if t.shape != ref.shape:
            raise ValueError(f"tensor {name!r}: shape {t.shape} differs from {ref.shape}")
        arrays.append(t.astype(np.float64, copy=False))
    return np.stack(arrays), ref.dtype


def _cast(acc: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    if np.issubdtype(dtype, np.integer) or dtype == np.bool_:
        acc = np.rint(acc)
    return acc.astype(dtype, copy=False)


def _check_names(states: Sequence[State], what: str) -> list[str]:
    if len(states) == 0:
        raise ValueError(f"{what} needs at least one state")
    names = list(states[0].keys())
    for i, s in enumerate(states[1:], start=1):
        if list(s.keys()) != names:
            missing = set(names) ^ set(s.keys())
            raise ValueError(f"state {i} has different tensor names: {sorted(missing)[:5]}")
    return names


def coordinate_median(states: Sequence[State]) -> dict[str, np.ndarray]:
    """The median of every coordinate over the states (unweighted; an even count averages the
    two middle values). A minority of fewer than half the states cannot move it past the
    honest values' range, whatever their size."""
    out: dict[str, np.ndarray] = {}
    for name in _check_names(states, "coordinate_median"):
        stack, dtype = _stacked(states, name)
        out[name] = _cast(np.median(stack, axis=0), dtype)
    return out


def trimmed_mean(states: Sequence[State], trim: float) -> dict[str, np.ndarray]:
    """Coordinate-wise trimmed mean: at each coordinate, drop the ``floor(trim * n)`` lowest and
    as many highest values of the ``n`` states and average the rest (unweighted).

    ``trim`` lies in [0, 0.5); 0 is the plain mean. With n = 5 and trim 0.2 the lowest and the
    highest value of each coordinate are dropped.
    """
    if not 0 <= trim < 0.5:
        raise ValueError(f"trim must lie in [0, 0.5), got {trim}")
    names = _check_names(states, "trimmed_mean")
    n = len(states)
    k = int(np.floor(trim * n))
    out: dict[str, np.ndarray] = {}
    for name in names:
        stack, dtype = _stacked(states, name)
        kept = np.sort(stack, axis=0)[k : n - k]
        out[name] = _cast(kept.mean(axis=0), dtype)
    return out


def robust_mean(
    states: Sequence[State],
    weights: Sequence[float] | npt.ArrayLike,
    *,
    method: str = "mean",
    trim: float = 0.2,
) -> dict[str, np.ndarray]:
    """One cluster's aggregate by ``method``: ``mean`` (:func:`weighted_mean` by ``weights``),
    ``trimmed_mean`` (:func:`trimmed_mean`, ``trim``) or ``median``
    (:func:`coordinate_median`); the robust rules ignore the weights (a sample count is the
    robot's own claim)."""
    if method == "mean":
        return weighted_mean(states, weights)
    if method == "trimmed_mean":
        return trimmed_mean(states, trim)
    if method == "median":
        return coordinate_median(states)
    raise ValueError(f"unknown aggregation {method!r}; use one of {', '.join(AGGREGATIONS)}")


def cluster_models(
    states: Sequence[State],
    sizes: Sequence[float] | npt.ArrayLike,
    M_star: npt.ArrayLike,
    *,
    rule: ClusterRule | None = None,
    previous: Sequence[State] | None = None,
) -> list[State]:
    """Cluster model k = data-size weighted mean of its members' states (paper: w_k^t).

    ``states[c]`` and ``sizes[c]`` belong to client c (column c of the K x N map ``M_star``);
    members are taken in client order. ``rule`` replaces the weighted mean (e.g.
    :func:`robust_mean` with its ``method``). A cluster without members keeps ``previous[k]``
    (a round in which none of its members reported); without ``previous`` it is an error.
    """
    m = np.asarray(M_star, dtype=bool)
    sz = np.asarray(sizes, dtype=np.float64).reshape(-1)
    if m.ndim != 2 or m.shape[1] != len(states) or sz.size != len(states):
        raise ValueError(
            f"map {m.shape}, {len(states)} states and {sz.size} sizes do not agree on N clients"
        )
    if previous is not None and len(previous) != m.shape[0]:
        raise ValueError(f"{len(previous)} previous states given for {m.shape[0]} clusters")
    aggregate = rule or weighted_mean
    out: list[State] = []
    for k, row in enumerate(m):
        members = np.flatnonzero(row)
        if members.size:
            out.append(aggregate([states[int(c)] for c in members], sz[members].tolist()))
        elif previous is not None:
            out.append(previous[k])
        else:
            raise ValueError(f"cluster {k} has no members")
    return out


#: Name endings of BatchNorm's running statistics: a server step leaves them at the aggregate
#: (an extrapolated variance could turn negative).
RUNNING_STATISTICS = ("running_mean", "running_var")


def check_server_optimizer(lr: float, momentum: float) -> None:
    """Raise ValueError unless ``lr`` > 0 (finite) and ``momentum`` in [0, 1)."""
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"server lr must be a number > 0, got {lr!r}")
    if not 0 <= momentum < 1:
        raise ValueError(f"server momentum must lie in [0, 1), got {momentum!r}")


def server_step(
    previous: State,
    aggregate: State,
    velocity: State | None,
    *,
    lr: float,
    momentum: float,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One server optimizer step on a model (FedAvgM, Hsu et al. 2019): ``(new, velocity)``.

    The round's pseudo-gradient is ``d = aggregate - previous``; ``v = momentum * v + d``
    (``velocity`` None: zeros) and ``new = previous + lr * v``, in float64, cast back to each
    tensor's dtype. With ``lr`` 1 and ``momentum`` 0 ``new`` is ``aggregate``. Integer tensors
    and BatchNorm's running statistics (:data:`RUNNING_STATISTICS`) take the aggregate and keep
    no velocity.
    """
    check_server_optimizer(lr, momentum)
    names = _check_names([previous, aggregate], "server_step")
    new: dict[str, np.ndarray] = {}
    out_velocity: dict[str, np.ndarray] = {}
    for name in names:
        agg = np.asarray(aggregate[name])
        if not np.issubdtype(agg.dtype, np.floating) or name.endswith(RUNNING_STATISTICS):
            new[name] = agg
            continue
        d = agg.astype(np.float64) - np.asarray(previous[name], dtype=np.float64)
        if velocity is not None and name in velocity:
            d += momentum * np.asarray(velocity[name], dtype=np.float64)
        out_velocity[name] = d.astype(np.float32)
        new[name] = _cast(np.asarray(previous[name], dtype=np.float64) + lr * d, agg.dtype)
    return new, out_velocity


def client_models(
    cluster_states: Sequence[State], M_star: npt.ArrayLike
) -> list[dict[str, np.ndarray]]:
    """Client model c = plain mean of the models of the clusters it belongs to (paper: w_c^{t+1}).

    Computed on the server, so a client downloads one model whatever its memberships. Clients in
    exactly one cluster share that cluster's arrays (no copy).
    """
    m = np.asarray(M_star, dtype=bool)
    if m.ndim != 2 or m.shape[0] != len(cluster_states):
        raise ValueError(f"map {m.shape} does not match {len(cluster_states)} cluster states")
    out: list[dict[str, np.ndarray]] = []
    for c, col in enumerate(m.T):
        ks = np.flatnonzero(col)
        if ks.size == 0:
            raise ValueError(f"client {c} belongs to no cluster")
        if ks.size == 1:
            out.append(dict(cluster_states[ks[0]]))
        else:
            out.append(weighted_mean([cluster_states[int(k)] for k in ks], np.ones(ks.size)))
    return out
