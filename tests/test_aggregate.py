"""Tests of fedepth.strategies.aggregate on tiny states with hand-computed answers."""

from __future__ import annotations

import numpy as np
import pytest

from fedepth.strategies.aggregate import client_models, cluster_models, weighted_mean


def _s(v: float) -> dict[str, np.ndarray]:
    return {"w": np.full((2,), v, dtype=np.float32), "n": np.array(int(v), dtype=np.int64)}


def test_weighted_mean_by_hand() -> None:
    out = weighted_mean([_s(1.0), _s(2.0)], [1, 2])
    np.testing.assert_allclose(out["w"], (1 * 1 + 2 * 2) / 3)
    assert out["w"].dtype == np.float32
    assert out["n"].dtype == np.int64 and int(out["n"]) == 2  # 5/3 rounds to 2


def test_weighted_mean_errors() -> None:
    with pytest.raises(ValueError, match="at least one"):
        weighted_mean([], [])
    with pytest.raises(ValueError, match="non-negative"):
        weighted_mean([_s(1.0)], [-1])
    with pytest.raises(ValueError, match="2 weights"):
        weighted_mean([_s(1.0)], [1, 1])
    with pytest.raises(ValueError, match="different tensor names"):
        weighted_mean([_s(1.0), {"w": np.zeros(2)}], [1, 1])
    with pytest.raises(ValueError, match="shape"):
        weighted_mean([{"w": np.zeros(2)}, {"w": np.zeros(3)}], [1, 1])


def test_two_clusters_with_an_overlapping_client() -> None:
    # clients 0, 1, 2 with values 1, 2, 4 and sizes 10, 30, 60;
    # cluster 0 = {0, 1}, cluster 1 = {1, 2}: client 1 is in both.
    states = [_s(1.0), _s(2.0), _s(4.0)]
    M = np.array([[1, 1, 0], [0, 1, 1]], dtype=bool)
    ks = cluster_models(states, [10, 30, 60], M)
    np.testing.assert_allclose(ks[0]["w"], (10 * 1 + 30 * 2) / 40)  # 1.75
    np.testing.assert_allclose(ks[1]["w"], (30 * 2 + 60 * 4) / 90)  # 3.333...
    cs = client_models(ks, M)
    np.testing.assert_allclose(cs[0]["w"], 1.75)
    np.testing.assert_allclose(cs[1]["w"], (1.75 + 300 / 90) / 2)
    np.testing.assert_allclose(cs[2]["w"], 300 / 90, rtol=1e-6)


def test_single_cluster_is_fedavg() -> None:
    states = [_s(1.0), _s(2.0), _s(4.0)]
    ks = cluster_models(states, [1, 1, 2], np.ones((1, 3), dtype=bool))
    assert len(ks) == 1
    np.testing.assert_allclose(ks[0]["w"], (1 + 2 + 8) / 4)
    for c in client_models(ks, np.ones((1, 3), dtype=bool)):
        np.testing.assert_allclose(c["w"], 11 / 4)


def test_map_shape_errors() -> None:
    with pytest.raises(ValueError, match="N clients"):
        cluster_models([_s(1.0)], [1, 2], np.ones((1, 2), dtype=bool))
    with pytest.raises(ValueError, match="no members"):
        cluster_models([_s(1.0)], [1], np.zeros((1, 1), dtype=bool))
    with pytest.raises(ValueError, match="belongs to no cluster"):
        client_models([_s(1.0)], np.array([[1, 0]], dtype=bool))
