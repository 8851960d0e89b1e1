"""Aggregation arithmetic shared by every strategy: plain functions on dicts of numpy arrays.

A *state* is a mapping from tensor name to array (a model's ``state_dict`` as numpy). All means
accumulate in float64 and are cast back to each tensor's dtype; integer tensors (BatchNorm's
``num_batches_tracked``) are rounded to the nearest integer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

State = Mapping[str, np.ndarray]


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
    names = list(states[0].keys())
    for i, s in enumerate(states[1:], start=1):
        if list(s.keys()) != names:
            missing = set(names) ^ set(s.keys())
            raise ValueError(f"state {i} has different tensor names: {sorted(missing)[:5]}")
    out: dict[str, np.ndarray] = {}
    for name in names:
        ref = np.asarray(states[0][name])
        acc = np.zeros(ref.shape, dtype=np.float64)
        for wi, s in zip(w, states, strict=True):
            t = np.asarray(s[name])
            if t.shape != ref.shape:
                raise ValueError(f"tensor {name!r}: shape {t.shape} differs from {ref.shape}")
            if wi:
                acc += wi * t
        if np.issubdtype(ref.dtype, np.integer) or ref.dtype == np.bool_:
            acc = np.rint(acc)
        out[name] = acc.astype(ref.dtype, copy=False)
    return out


def cluster_models(
    states: Sequence[State], sizes: Sequence[float] | npt.ArrayLike, M_star: npt.ArrayLike
) -> list[dict[str, np.ndarray]]:
    """Cluster model k = data-size weighted mean of its members' states (paper: w_k^t).

    ``states[c]`` and ``sizes[c]`` belong to client c (column c of the K x N map ``M_star``).
    """
    m = np.asarray(M_star, dtype=bool)
    sz = np.asarray(sizes, dtype=np.float64).reshape(-1)
    if m.ndim != 2 or m.shape[1] != len(states) or sz.size != len(states):
        raise ValueError(
            f"map {m.shape}, {len(states)} states and {sz.size} sizes do not agree on N clients"
        )
    out = []
    for k, row in enumerate(m):
        members = np.flatnonzero(row)
        if members.size == 0:
            raise ValueError(f"cluster {k} has no members")
        out.append(weighted_mean([states[int(c)] for c in members], sz[members]))
    return out


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
